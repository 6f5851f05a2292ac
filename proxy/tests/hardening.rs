//! End to end: the proxy does not let clients steer around its rules or exhaust backends.

use crate::support::*;
use bytes::Bytes;
use cftunnel_proxy::ServerOptions;
use cftunnel_testkit::client::{connect_h2c, connect_http1};
use http::StatusCode;
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn dot_segments_and_double_slashes_cannot_sidestep_a_rule() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}], "unavailableStatus": 403, "backends": []},
            {"backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]})).await;
        let d = proxy.data_addr();
        // Percent-encoded unreserved characters are the characters themselves (RFC 3986
        // §6.2.2.2), as backends that decode before routing read them.
        for path in [
            "/admin", "/x/../admin", "//admin", "/./admin/", "/x/%2e%2e/y/../../admin",
            "/%61dmin/users", "/%61%64%6D%69%6e", "/x/%2E%2E/admin", "/x/.%2e/admin",
        ] {
            let r = raw(d, format!("GET {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n").as_bytes()).await;
            assert!(r.starts_with("HTTP/1.1 403"), "{path} must hit the /admin rule: {:?}", r.get(..30));
        }
        // A `%` that starts no escape is refused: decoding beside it could make a new escape
        // (`%2%65` would become `%2e`).
        for path in ["/x/%2%65%2%65/admin", "/x/%%32e%%32e/admin", "/100%", "/a%zz"] {
            let r = raw(d, format!("GET {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n").as_bytes()).await;
            assert!(r.starts_with("HTTP/1.1 400"), "{path}: {:?}", r.get(..30));
        }
        let r = get(&http, d, "h", "/a//b/./c/../d?q=1", &[]).await;
        assert_eq!(r.json()["path"], "/a/b/d?q=1", "the backend sees the normalised path");
        // An encoded `/` is not a segment boundary, nor is any other reserved character.
        let r = get(&http, d, "h", "/%7euser/%41%2Fadmin%3F?q=%61", &[]).await;
        assert_eq!(r.json()["path"], "/~user/A%2Fadmin%3F?q=%61", "as decoded for routing");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn only_websocket_upgrades_are_spliced_and_absolute_form_hosts_are_consistent() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b) = (echo("svc-a-1").await, echo("svc-b-1").await);
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [
            {"hostnames": ["a.example"], "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"hostnames": ["b.example"], "backends": [{"url": url(b.http_addr()), "weight": 1}]}
        ]})).await;
        let d = proxy.data_addr();
        let r = get(
            &http,
            d,
            "a.example",
            "/",
            &[
                ("connection", "upgrade"),
                ("upgrade", "h2c"),
                ("http2-settings", "AAMAAABkAAQAAP__"),
            ],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.seen_header("Upgrade"),
            None,
            "an h2c upgrade is not passed on"
        );
        assert_eq!(r.seen_header("Connection"), None);

        let r = raw(
            d,
            b"GET http://a.example/abs HTTP/1.1\r\nhost: b.example\r\nconnection: close\r\n\r\n",
        )
        .await;
        let body = r.split("\r\n\r\n").nth(1).unwrap_or_default();
        let seen: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(
            seen["pod"], "svc-a-1",
            "routed by the request target's authority"
        );
        assert_eq!(
            seen["host"], "a.example",
            "and the backend sees that same host"
        );

        // Two Host headers: routed on one, a backend could read the other.
        let r = raw(
            d,
            b"GET /two HTTP/1.1\r\nhost: a.example\r\nhost: b.example\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        // None (RFC 9112 §3.2): a backend would see its own address instead.
        let r = raw(d, b"GET /none HTTP/1.1\r\nconnection: close\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        // HTTP/1.0 needs none: routed (to no rule of a host here), not refused.
        let r = raw(d, b"GET /old HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.0 404"), "{r}");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn varying_the_host_does_not_open_new_backend_connections() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let http = client();
        let proxy = proxy_to(&http, a.http_addr()).await;
        let d = proxy.data_addr();
        for i in 0..20 {
            assert_eq!(
                get(
                    &http,
                    d,
                    &format!("h{i}.example:{}", 1000 + i),
                    "/pool",
                    &[]
                )
                .await
                .status,
                StatusCode::OK
            );
        }
        let peers: std::collections::HashSet<String> = a
            .log_lines()
            .iter()
            .filter_map(|l| l.rsplit_once('(').map(|(_, p)| p.to_owned()))
            .collect();
        assert_eq!(
            peers.len(),
            1,
            "sequential requests share one pooled connection: {peers:?}"
        );
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn streamed_uploads_outlast_the_backend_timeout_and_chunked_bodies_are_retried() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/upload"}}], "timeouts": {"backend": "300ms"},
             "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/retry"}}], "retry": {"codes": [500], "attempts": 2},
             "backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]})).await;
        let d = proxy.data_addr();

        // 1 s of chunked upload against a 300 ms backend timeout.
        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(b"POST /upload HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").await.expect("head");
        for _ in 0..5 {
            s.write_all(b"4\r\ndata\r\n").await.expect("chunk");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        s.write_all(b"0\r\n\r\n").await.expect("end");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 200"), "the timeout starts after the upload: {:?}", out.get(..40));

        // A client that pauses longer than the backend timeout between chunks is waited for:
        // the timeout bounds a backend that stops taking the body, not a slow client.
        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(b"POST /upload HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").await.expect("head");
        for _ in 0..3 {
            s.write_all(b"4\r\ndata\r\n").await.expect("chunk");
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        s.write_all(b"0\r\n\r\n").await.expect("end");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 200"), "pauses of the client are not stalls: {:?}", out.get(..40));

        // A chunked body of unknown length is buffered and replayed on retry.
        let r = raw(d, b"POST /retry/x?responseCode=500&succeedAfter=1&uuid=chunked HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{:?}", r.get(..40));
    })
    .await
    .expect("test finished in time");
}

/// Uploads `size` bytes through a proxy whose one rule sends to `backend` with a 500 ms backend
/// timeout, and asserts the answer is 504 at about that timeout.
async fn upload_times_out(backend: &str, size: usize) {
    let proxy = proxy().await;
    let http = client();
    push(
        &http,
        proxy.admin_addr(),
        &json!({"rules": [
            {"timeouts": {"backend": "500ms"}, "backends": [{"url": backend, "weight": 1}]}
        ]}),
    )
    .await;
    let (answer, took) = answer_to_a_held_upload(
        proxy.data_addr(),
        "POST /upload HTTP/1.1\r\nhost: h\r\n",
        size,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(took < Duration::from_secs(5), "at the timeout: {took:?}");
}

/// A backend that takes part of an upload and then nothing more gets the rule's timeout, not
/// as long as the client keeps the upload open: the request ends with 504.
#[tokio::test]
async fn an_upload_the_backend_stops_taking_times_out() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Reads the request head and then nothing; small buffers, so the upload backs up.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("receive buffer");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let listener = socket.listen(16).expect("listen");
        let backend = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut head = [0u8; 512];
                let _ = conn.read(&mut head).await;
                held.push(conn);
            }
        });
        upload_times_out(&format!("http://{backend}"), 16 * 1024 * 1024).await;
        held.abort();
    })
    .await
    .expect("test finished in time");
}

/// A streamed upload whose try never gets a connection to send it on (a TLS backend that
/// accepts and never answers the handshake) gets the rule's timeout counted from the try's
/// start, as a body held whole does, not the dial's own 10 s.
#[tokio::test]
async fn an_upload_whose_backend_never_finishes_its_handshake_times_out() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let backend = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        // Past the 64 KiB held whole: streamed.
        upload_times_out(&format!("https://{backend}"), 1024 * 1024).await;
        held.abort();
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn forwarding_headers_keep_every_earlier_hop() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]})).await;
        let r = raw(proxy.data_addr(), b"GET /xff HTTP/1.1\r\nhost: h\r\nx-forwarded-for: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2\r\nx-forwarded-proto: https\r\nconnection: close\r\n\r\n").await;
        let body = r.split("\r\n\r\n").nth(1).unwrap_or_default();
        let seen: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(seen["headers"]["X-Forwarded-For"], json!(["10.0.0.1, 10.0.0.2, 127.0.0.1"]));
        assert_eq!(seen["headers"]["X-Forwarded-Proto"], json!(["http"]), "a client cannot claim https");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn versions_are_measured_against_the_version_served_and_json_errors_name_the_field() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let admin = proxy.admin_addr();
        assert_eq!(push(&http, admin, &json!({"version": 7, "rules": []})).await.status, StatusCode::OK);
        assert_eq!(push(&http, admin, &json!({"version": 6, "rules": []})).await.status, StatusCode::CONFLICT);
        // After an unversioned push the version served (and reported by `GET /config`) is 0, so
        // a pusher that reads it after a 409 gets past it.
        assert_eq!(push(&http, admin, &json!({"version": 0, "rules": []})).await.status, StatusCode::OK);
        assert_eq!(push(&http, admin, &json!({"version": 6, "rules": []})).await.status, StatusCode::OK);
        assert_eq!(push(&http, admin, &json!({"version": 5, "rules": []})).await.status, StatusCode::CONFLICT);
        assert_eq!(push(&http, admin, &json!({"version": 6, "rules": []})).await.status, StatusCode::OK, "equal is re-applied");
        // A negative version is refused, naming the field; version 6 stays in service.
        let r = push(&http, admin, &json!({"version": -1, "rules": []})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.json()["error"].as_str().unwrap_or_default().starts_with("version:"), "{:?}", r.body);
        assert_eq!(push(&http, admin, &json!({"version": 5, "rules": []})).await.status, StatusCode::CONFLICT);
        let r = push_raw(&http, admin, Some(TOKEN), "application/json", Bytes::from_static(br#"{"rules":[{"backends":[{"url":"http://x","weight":"heavy"}]}]}"#)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.json()["error"].as_str().unwrap_or_default().contains("rules[0].backends[0].weight"), "{:?}", r.body);
        let r = push(&http, admin, &json!({"rules": [{"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "bad host"}}], "backends": []}]})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
    })
    .await
    .expect("test finished in time");
}

/// A spliced WebSocket ends as a whole when either side ends its half, as Go's reverse proxy
/// ends it (the first direction to finish closes both connections): a backend that ignores
/// the client's end of stream cannot keep the session, and its in-flight count, open.
#[tokio::test]
async fn a_websocket_ends_as_a_whole_when_the_client_ends_its_side() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // A backend that switches protocols, then neither writes nor closes; it reports when
        // the proxy closes the connection on it.
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut conn, _) = backend.accept().await.unwrap();
            read_head(&mut conn).await;
            conn.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
                  sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
            )
            .await
            .unwrap();
            // Reads until the proxy ends the stream, holding its own side open throughout.
            let mut buf = [0u8; 1024];
            while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
            std::future::pending::<()>().await;
        });
        let http = client();
        let proxy = proxy_to(&http, backend_addr).await;
        let mut conn = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .unwrap();
        conn.write_all(
            b"GET /ws HTTP/1.1\r\nhost: ws.example\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
              sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .unwrap();
        let head = read_head(&mut conn).await;
        let mut buf = [0u8; 64];
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{:?}",
            String::from_utf8_lossy(&head)
        );
        conn.shutdown().await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
        assert!(
            matches!(ended, Ok(Ok(0)) | Ok(Err(_))),
            "the proxy ends the client's connection: {ended:?}"
        );
        tokio::time::timeout(Duration::from_secs(2), closed_rx)
            .await
            .expect("the proxy ends the backend's connection")
            .unwrap();
        let gauge = "cftunnel_proxy_websocket_active_sessions";
        let zero_by = std::time::Instant::now() + Duration::from_secs(2);
        while metric(&http, proxy.admin_addr(), gauge).await != Some(0.0) {
            assert!(std::time::Instant::now() < zero_by, "the session is over");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("test finished in time");
}

/// Reads up to the end of an HTTP/1.1 head (and whatever arrived with it).
/// A path is routed as a browser sends it: bytes a path may not carry as they are (UTF-8,
/// `{`, `|`...) are percent-encoded before matching, so a client sending them raw meets the
/// same rule as one sending them encoded, and a rule may be written either way.
#[tokio::test]
async fn raw_bytes_in_a_path_cannot_sidestep_a_rule() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/%C3%A9t%C3%A9"}}], "unavailableStatus": 403, "backends": []},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/ünï"}}], "unavailableStatus": 410, "backends": []},
            {"matches": [{"path": {"type": "Exact", "value": "/a%7Bb%7D"}}], "unavailableStatus": 403, "backends": []},
            {"backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]})).await;
        let d = proxy.data_addr();
        let status = |path: &str| {
            let head = format!("GET {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n");
            async move {
                let r = raw(d, head.as_bytes()).await;
                r.get(9..12).unwrap_or_default().to_owned()
            }
        };
        for (path, want) in [
            ("/été/secret", "403"),
            ("/%c3%a9t%c3%a9/secret", "403"),
            ("/a{b}", "403"),
            ("/%C3%BCn%C3%AF/x", "410"),
            ("/ünï", "410"),
            ("/other", "200"),
        ] {
            assert_eq!(status(path).await, want, "{path}");
        }
        let r = raw(d, "GET /caf\u{e9}?q=\u{e9} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n".as_bytes()).await;
        assert!(
            r.contains(r#""path": "/caf%C3%A9?q="#),
            "the backend sees the path as it was routed: {r}"
        );
    })
    .await
    .expect("test finished in time");
}

/// A `Host` header with bytes no host has is refused, not routed on its suffix.
#[tokio::test]
async fn a_malformed_host_is_refused() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(&http, proxy.admin_addr(), &json!({"rules": [
            {"hostnames": ["*.example.com"], "backends": [{"url": url(a.http_addr()), "weight": 1}]},
            {"backends": [{"url": url(a.http_addr()), "weight": 1}]}
        ]})).await;
        let d = proxy.data_addr();
        for (host, want) in [
            ("evil.test/.example.com", "400"),
            ("evil.test\\.example.com", "400"),
            ("a\"b.example.com", "400"),
            ("a<b>.example.com", "400"),
            ("a b.example.com", "400"),
            ("app.example.com", "200"),
            ("app.example.com:8443", "200"),
            ("[::1]:8080", "200"),
            ("xn--bcher-kva.example.com", "200"),
            ("under_score.example.com.", "200"),
        ] {
            let r = raw(d, format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes()).await;
            assert_eq!(r.get(9..12), Some(want), "{host}: {:?}", r.get(..40));
        }
    })
    .await
    .expect("test finished in time");
}

async fn read_head(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap_or(0);
        assert!(n > 0, "a head arrives before the end of the stream");
        head.extend_from_slice(&buf[..n]);
    }
    head
}

async fn status_over(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>,
) -> StatusCode {
    let req = http::Request::get("/")
        .header("host", "h")
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    sender.send_request(req).await.expect("response").status()
}

/// `PROXY_MAX_CONNECTIONS` bounds the client connections the data listener holds: at the limit
/// it accepts no more (a new client waits in the kernel's backlog) until one closes, and then
/// serves the one that waited.
#[tokio::test]
async fn the_listener_holds_no_more_connections_than_its_limit() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                max_connections: 2,
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let d = proxy.data_addr();
        // No table yet: every request is answered 502 by the proxy itself.
        let mut open = Vec::new();
        for _ in 0..2 {
            let (mut sender, task) = connect_http1(d).await.expect("connect");
            assert_eq!(status_over(&mut sender).await, StatusCode::BAD_GATEWAY);
            open.push((sender, task));
        }

        let (mut third, _third_task) = connect_http1(d).await.expect("connect");
        let waiting = status_over(&mut third);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut waiting)
                .await
                .is_err(),
            "a third connection is not served while two are open"
        );

        // One client leaves: its connection closes and the waiting one is accepted.
        if let Some((sender, task)) = open.pop() {
            drop(sender);
            task.abort();
        }
        let status = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("served once a connection closed");
        assert_eq!(status, StatusCode::BAD_GATEWAY);
    })
    .await
    .expect("test finished in time");
}

fn h2_get(host: &str) -> http::Request<http_body_util::Full<Bytes>> {
    http::Request::get(format!("http://{host}/"))
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request")
}

/// Whether the peer has closed `conn` (end of stream or reset) within `within`.
async fn closed_within(conn: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read_to_end = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_to_end).await.is_ok()
}

/// One peer that opens the admin port's every place and sends nothing holds only its share,
/// its newest connections: the kubelet's probes are answered at once, whether they come from
/// another address or from the same one (the node's, which hostNetwork agents and SNATed
/// traffic share), instead of waiting in the listen backlog until they fail.
#[tokio::test]
async fn one_peer_cannot_take_every_place_on_the_admin_port() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let admin = proxy.admin_addr();
        // Loopback answers on all of 127/8: 127.0.0.2 is another peer than 127.0.0.1.
        let connect_from = |source: &'static str| async move {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind(format!("{source}:0").parse().expect("addr"))
                .expect("bind");
            socket.connect(admin).await.expect("connect")
        };
        let mut held = Vec::new();
        for _ in 0..300 {
            held.push(connect_from("127.0.0.2").await);
        }
        let mut open = Vec::new();
        for (i, conn) in held.iter_mut().enumerate() {
            if !closed_within(conn, Duration::from_millis(100)).await {
                open.push(i);
            }
        }
        let share = cftunnel_proxy::admin::MAX_CONNECTIONS_PER_PEER;
        assert_eq!(
            open,
            (300 - share..300).collect::<Vec<_>>(),
            "the peer keeps its newest share"
        );

        for source in ["127.0.0.1", "127.0.0.2"] {
            let mut probe = connect_from(source).await;
            probe
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")
                .await
                .expect("write");
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(2), probe.read_to_end(&mut answer))
                .await
                .unwrap_or_else(|_| panic!("the probe from {source} is answered at once"))
                .expect("read");
            assert!(
                answer.starts_with(b"HTTP/1.1 200"),
                "{source}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        drop(held);

        // A connection with a request in flight (a push whose body is still coming) keeps its
        // place however many of its peer's connections come after it.
        let mut pushing = connect_from("127.0.0.3").await;
        let body = br#"{"version": 7, "rules": []}"#;
        let head = format!(
            "PUT /config HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        pushing
            .write_all(head.as_bytes())
            .await
            .expect("write head");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut later = Vec::new();
        for _ in 0..2 * share {
            later.push(connect_from("127.0.0.3").await);
        }
        pushing.write_all(body).await.expect("write body");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), pushing.read_to_end(&mut answer))
            .await
            .expect("the push is answered")
            .expect("read");
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    })
    .await
    .expect("test finished in time");
}

/// A client that stops reading its answer, or stops sending a push's body, loses its admin
/// place after the send or request-body timeout: held for good, a few of them would keep the
/// kubelet's probes waiting in the listen backlog.
#[tokio::test]
async fn stalled_admin_clients_give_their_places_back() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            admin_max_connections: 2,
            request_body_timeout: Duration::from_millis(500),
            limits: cftunnel_proxy::serve::Limits {
                send_timeout: Duration::from_secs(1),
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let admin = proxy.admin_addr();
        // A document kept as pushed, padding and all: its answer outgrows the socket buffers.
        let mut document = br#"{"version": 3, "rules": []}"#.to_vec();
        document.resize(document.len() + 8 * 1024 * 1024, b' ');
        let head = format!(
            "PUT /config HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            document.len()
        );
        let answer = raw(admin, &[head.as_bytes(), &document].concat()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{:?}", answer.get(..60));

        let small_window = || async {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.set_recv_buffer_size(4096).expect("receive buffer");
            socket.connect(admin).await.expect("connect")
        };
        let mut not_reading = small_window().await;
        not_reading
            .write_all(
                format!("GET /config/document HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("write");
        let mut not_sending = small_window().await;
        not_sending
            .write_all(
                format!(
                    "PUT /config HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\
                     content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"version\""
                )
                .as_bytes(),
            )
            .await
            .expect("write");

        // Both places are taken: the probe waits until the stalls are seen.
        let started = std::time::Instant::now();
        let answer = raw(admin, b"GET /healthz HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "the probe is answered: {answer:?}");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "within the timeouts: {:?}",
            started.elapsed()
        );
        // The push that stopped sending its body is answered 408.
        let head = read_head(&mut not_sending).await;
        assert!(
            head.starts_with(b"HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        // Read only once the send timeout has passed: reading would let the answer through.
        tokio::time::sleep_until((started + Duration::from_millis(1500)).into()).await;
        for (name, conn) in [("not reading", &mut not_reading), ("not sending", &mut not_sending)] {
            assert!(closed_within(conn, Duration::from_secs(3)).await, "{name} is closed");
        }
    })
    .await
    .expect("test finished in time");
}

/// Only a push body's arrival is timed: a push whose body came whole is answered however long
/// it takes to apply, here well past the request-body timeout.
#[tokio::test]
async fn a_push_applied_slower_than_the_body_timeout_is_answered() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            request_body_timeout: Duration::from_millis(100),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let rules: Vec<_> = (0..40_000)
            .map(|i| json!({"hostnames": [format!("h{i}.example.com")], "unavailableStatus": 503, "backends": []}))
            .collect();
        let document = serde_json::to_vec(&json!({"version": 4, "rules": rules})).expect("json");
        let head = format!(
            "PUT /config HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            document.len()
        );
        let mut push = tokio::net::TcpStream::connect(proxy.admin_addr()).await.expect("connect");
        push.write_all(&[head.as_bytes(), &document].concat()).await.expect("write");
        let sent = std::time::Instant::now();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), push.read_to_end(&mut answer))
            .await
            .expect("the push is answered")
            .expect("read");
        let took = sent.elapsed();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // What the test rests on: once the body was sent, the answer took longer than the
        // body timeout.
        assert!(took > Duration::from_millis(100), "the push took longer than the body timeout: {took:?}");
    })
    .await
    .expect("test finished in time");
}

/// A new connection must send its first request within the head timeout, whatever it speaks:
/// one that sends nothing, an HTTP/2 client that opens no stream and one that sent the HTTP/2
/// preface and then nothing (not even the acknowledgement of the proxy's GOAWAY ping) are all
/// closed, and their places at `PROXY_MAX_CONNECTIONS` go to clients that wait.
#[tokio::test]
async fn silent_connections_are_closed_and_free_their_places() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                max_connections: 3,
                header_read_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let d = proxy.data_addr();
        let mut silent = tokio::net::TcpStream::connect(d).await.expect("connect");
        let (_h2, h2_task) = connect_h2c::<http_body_util::Full<Bytes>>(d)
            .await
            .expect("connect");
        let mut preface_only = tokio::net::TcpStream::connect(d).await.expect("connect");
        // The preface and an empty SETTINGS frame.
        preface_only
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("preface");

        let (mut waiting, _task) = connect_http1(d).await.expect("connect");
        let status = tokio::time::timeout(Duration::from_secs(20), status_over(&mut waiting))
            .await
            .expect("a waiting client is served once silent connections are closed");
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "answered by the proxy, which has no table"
        );
        assert!(
            closed_within(&mut silent, Duration::from_secs(20)).await,
            "a connection that sends nothing is closed"
        );
        tokio::time::timeout(Duration::from_secs(20), h2_task)
            .await
            .expect("an HTTP/2 connection that opens no stream is closed")
            .expect("task");
        assert!(
            closed_within(&mut preface_only, Duration::from_secs(20)).await,
            "an HTTP/2 peer that ignores the GOAWAY is closed too"
        );
    })
    .await
    .expect("test finished in time");
}

/// The head timeout bounds every head on a keep-alive HTTP/1.1 connection, not only the
/// first: a client that has been served once and then drips its next head gets no longer than
/// the head timeout, although the idle timeout is far longer.
#[tokio::test]
async fn a_slow_head_on_a_reused_connection_is_cut_off_at_the_head_timeout() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                header_read_timeout: Duration::from_millis(300),
                idle_timeout: Duration::from_secs(120),
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let mut conn = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        conn.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("request");
        let head = read_head(&mut conn).await;
        assert!(
            head.starts_with(b"HTTP/1.1 502"),
            "answered by the proxy, which has no table: {:?}",
            String::from_utf8_lossy(&head)
        );
        // Half of the next head, then nothing.
        conn.write_all(b"GET / HTTP/1.1\r\nhost:")
            .await
            .expect("part of a head");
        assert!(
            closed_within(&mut conn, Duration::from_secs(5)).await,
            "the connection is closed long before the idle timeout"
        );
    })
    .await
    .expect("test finished in time");
}

/// Once it has served a request, a connection with none in flight is closed after the idle
/// timeout (HTTP/2 with a GOAWAY; HTTP/1.1 keep-alive after the head timeout when that is
/// shorter, as the next head is awaited from the moment a connection goes idle). A request whose answer is slow to start and slow to stream
/// is in flight throughout and is not cut.
#[tokio::test]
async fn idle_connections_are_closed_and_requests_in_flight_are_not() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Waits 1 s before its head, then streams 10 bytes over 1 s.
        let backend = scripted_backend(|mut conn| async move {
            read_head(&mut conn).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n";
            if conn.write_all(head).await.is_err() {
                return;
            }
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if conn.write_all(b"x").await.is_err() {
                    return;
                }
            }
        })
        .await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                max_connections: 3,
                header_read_timeout: Duration::from_millis(300),
                idle_timeout: Duration::from_millis(500),
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [{"hostnames": ["slow.example"], "backends": [{"url": format!("http://{backend}"), "weight": 1}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        // Two connections that served one request each and then sit idle.
        let (mut idle_h2, idle_h2_task) = connect_h2c(d).await.expect("connect");
        let r = idle_h2.send_request(h2_get("h")).await.expect("response");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let (mut idle_h1, idle_h1_task) = connect_http1(d).await.expect("connect");
        assert_eq!(status_over(&mut idle_h1).await, StatusCode::NOT_FOUND);
        // And one busy for 2 s, longer than either timeout.
        let (mut busy, _busy_task) = connect_h2c(d).await.expect("connect");
        let slow = tokio::spawn(async move {
            let r = busy.send_request(h2_get("slow.example")).await.expect("response");
            let status = r.status();
            let body = http_body_util::BodyExt::collect(r.into_body()).await.map(|b| b.to_bytes());
            (status, body)
        });

        let (mut waiting, _task) = connect_http1(d).await.expect("connect");
        let status = tokio::time::timeout(Duration::from_secs(20), status_over(&mut waiting))
            .await
            .expect("a waiting client is served once an idle connection is closed");
        assert_eq!(status, StatusCode::NOT_FOUND);
        tokio::time::timeout(Duration::from_secs(20), idle_h2_task)
            .await
            .expect("an idle HTTP/2 connection is closed")
            .expect("task");
        tokio::time::timeout(Duration::from_secs(20), idle_h1_task)
            .await
            .expect("an idle HTTP/1.1 connection is closed")
            .expect("task");
        let (status, body) = slow.await.expect("task");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.expect("the slow body arrives whole").len(), 10);
    })
    .await
    .expect("test finished in time");
}

/// An upgraded connection keeps its place at `PROXY_MAX_CONNECTIONS` for as long as its
/// WebSocket session lasts, although the HTTP connection it came on is over.
#[tokio::test]
async fn a_websocket_session_holds_its_connections_place_until_it_ends() {
    use futures_util::StreamExt as _;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                max_connections: 1,
                ..Default::default()
            },
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": format!("http://{}", a.http_addr()), "weight": 1, "websocket": true}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let mut ws = websocket_echoing(&format!("ws://{d}/ws"), "hello").await;

        let (mut second, _task) = connect_http1(d).await.expect("connect");
        let waiting = status_over(&mut second);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut waiting)
                .await
                .is_err(),
            "no second connection is served while the session is open"
        );

        ws.close(None).await.expect("close");
        while let Some(Ok(_)) = ws.next().await {}
        let status = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("served once the session ended");
        assert_eq!(status, StatusCode::OK);
    })
    .await
    .expect("test finished in time");
}

/// A client's first bytes may come in pieces: a split HTTP/2 preface is still served as
/// HTTP/2, and an HTTP/1.1 request sent a byte at first as HTTP/1.1.
#[tokio::test]
async fn a_connection_s_protocol_is_told_from_first_bytes_sent_in_pieces() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]}),
        )
        .await;
        let d = proxy.data_addr();

        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The rest of the preface, then an empty SETTINGS frame.
        s.write_all(b"\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("write");
        let mut head = [0u8; 9];
        s.read_exact(&mut head)
            .await
            .expect("the server's first frame");
        assert_eq!(head[3], 0x04, "an HTTP/2 SETTINGS frame: {head:?}");

        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(b"G").await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"ET / HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.expect("read");
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        );
    })
    .await
    .expect("test finished in time");
}

/// Trailers pass through an HTTP/1.1 hop: the `Trailer` header announcing them stays, since
/// an HTTP/1.1 encoder writes only the trailers a message announces (Go's reverse proxy
/// announces them again the same way).
#[tokio::test]
async fn trailers_of_a_chunked_response_reach_the_client() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = answering_backend(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc\r\n\r\n").await;
        let http = client();
        let proxy = proxy_to(&http, backend).await;
        let r = raw(
            proxy.data_addr(),
            b"GET /t HTTP/1.1\r\nhost: h\r\nte: trailers\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.to_ascii_lowercase().contains("x-checksum: abc"), "{r}");
    })
    .await
    .expect("test finished in time");
}

/// Reads a response head (and whatever came with it) until `want` shows, or `wait` passes.
async fn read_until(s: &mut tokio::net::TcpStream, want: &str, wait: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(wait, async {
        while !String::from_utf8_lossy(&got).contains(want) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// A proxy whose request body timeout is 300 ms, serving one host-less rule to `backend`.
async fn impatient_proxy_to(backend: std::net::SocketAddr) -> cftunnel_proxy::Server {
    let proxy = proxy_with(ServerOptions {
        request_body_timeout: Duration::from_millis(300),
        ..ServerOptions::default()
    })
    .await;
    let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
    assert_eq!(push(&client(), proxy.admin_addr(), &doc).await.status, 200);
    proxy
}

/// A client that stops sending its request body, before any response, is answered 408 once
/// the body timeout passes, and the backend connection it held is let go: a streamed body (the
/// backend already reading it) and one read first for a retry alike. Without the bound, each
/// such upload held a client connection, a backend connection and the backend's handler for
/// good.
#[tokio::test]
async fn a_stalled_upload_is_answered_408_and_lets_the_backend_go() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
        // Reads the request and its body as they come, answering nothing: a handler that
        // waits for the whole upload. Says when the proxy drops the connection.
        let backend = scripted_backend(move |mut conn: tokio::net::TcpStream| {
            let gone_tx = gone_tx.clone();
            async move {
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                let _ = gone_tx.send(());
            }
        })
        .await;
        let proxy = proxy_with(ServerOptions {
            request_body_timeout: Duration::from_millis(300),
            ..ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/retried"}}],
             "retry": {"codes": [503], "attempts": 2},
             "backends": [{"url": url(backend), "weight": 1}]},
            {"backends": [{"url": url(backend), "weight": 1}]},
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, 200);
        for (path, length) in [("/streamed", 100_000), ("/retried", 1_000)] {
            let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
                .await
                .expect("connect");
            s.write_all(
                format!("POST {path} HTTP/1.1\r\nhost: h\r\ncontent-length: {length}\r\n\r\nfirst bytes")
                    .as_bytes(),
            )
            .await
            .expect("write");
            let text = read_until(&mut s, "\r\n\r\n", Duration::from_secs(5)).await;
            assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text:?}");
        }
        // The streamed upload had reached the backend; its connection is closed.
        tokio::time::timeout(Duration::from_secs(5), gone.recv())
            .await
            .expect("the backend connection is let go");
    })
    .await
    .expect("test finished in time");
}

/// Once the response head has come, the request body may pause as long as it likes: a
/// bidirectional stream waits on its peer. Its later bytes still reach the backend.
#[tokio::test]
async fn a_request_body_may_pause_once_the_response_has_come() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Answers at the head, then sends back each piece of the body as it comes.
        let backend = scripted_backend(|mut conn: tokio::net::TcpStream| async move {
            let mut buf = [0u8; 4096];
            let Ok(n) = conn.read(&mut buf).await else {
                return;
            };
            let mut head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            if let Some(at) = buf[..n].windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = &buf[at + 4..n];
                if !rest.is_empty() {
                    head.extend_from_slice(format!("{:x}\r\n", rest.len()).as_bytes());
                    head.extend_from_slice(rest);
                    head.extend_from_slice(b"\r\n");
                }
            }
            if conn.write_all(&head).await.is_err() {
                return;
            }
            while let Ok(n @ 1..) = conn.read(&mut buf).await {
                let mut chunk = format!("{n:x}\r\n").into_bytes();
                chunk.extend_from_slice(&buf[..n]);
                chunk.extend_from_slice(b"\r\n");
                if conn.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        })
        .await;
        let proxy = impatient_proxy_to(backend).await;
        let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        s.write_all(
            b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n4\r\nping\r\n",
        )
        .await
        .expect("write");
        let first = read_until(&mut s, "ping", Duration::from_secs(5)).await;
        assert!(
            first.starts_with("HTTP/1.1 200") && first.contains("ping"),
            "{first:?}"
        );
        // Three times the body timeout without a byte.
        tokio::time::sleep(Duration::from_millis(900)).await;
        s.write_all(b"4\r\npong\r\n").await.expect("write");
        let later = read_until(&mut s, "pong", Duration::from_secs(5)).await;
        assert!(later.contains("pong"), "{later:?}");
    })
    .await
    .expect("test finished in time");
}

/// The kernel's view of this host's IPv4 TCP sockets: for each (local port, remote port), its
/// timer kind (`tr` in /proc/net/tcp: 2 is keep-alive).
fn tcp_timers() -> Vec<(u16, u16, u8)> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |addr: &str| {
        addr.split(':')
            .nth(1)
            .and_then(|p| u16::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let timer = f.get(5)?.split(':').next()?.parse().ok()?;
            Some((port(f.get(1)?), port(f.get(2)?), timer))
        })
        .collect()
}

/// The proxy's idle connections, to a client and to a backend, carry TCP keep-alive: a peer
/// that vanishes without a word is found out rather than held for good.
#[tokio::test]
async fn idle_client_and_backend_connections_carry_tcp_keepalive() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let http = client();
        let proxy = proxy_to(&http, a.http_addr()).await;
        let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("write");
        let text = read_until(&mut s, "\r\n\r\n", Duration::from_secs(5)).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
        let mine = s.local_addr().expect("addr").port();
        let data = proxy.data_addr().port();
        let backend = a.http_addr().port();
        let timers = tcp_timers();
        // The proxy's end of the client's connection: its port to the client's.
        assert!(
            timers.contains(&(data, mine, 2)),
            "the client connection: {:?}",
            timers.iter().filter(|t| t.0 == data).collect::<Vec<_>>()
        );
        // The proxy's pooled connection to the backend: some port to the backend's.
        assert!(
            timers
                .iter()
                .any(|&(_, remote, timer)| remote == backend && timer == 2),
            "the backend connection: {:?}",
            timers.iter().filter(|t| t.1 == backend).collect::<Vec<_>>()
        );
    })
    .await
    .expect("test finished in time");
}

/// A gRPC call's body that goes over HTTP/2 is not bounded by the body timeout: its messages
/// come when the client has something to say, and many servers send their response headers
/// only with their first message, so a quiet stream is not a stalled upload. To an HTTP/1.1
/// backend the client's word alone lifts no bound: the same pause is cut off, with gRPC's
/// DEADLINE_EXCEEDED.
#[tokio::test]
async fn a_grpc_request_body_may_pause_before_the_response_over_http2() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Answers once it has read the whole body.
        let h2c = scripted_backend(|conn: tokio::net::TcpStream| {
            let service = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    use http_body_util::BodyExt as _;
                    let body = req.into_body().collect().await?.to_bytes();
                    let answer = if &body[..] == b"firstsecond" { "ok" } else { "short" };
                    Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                        Bytes::from_static(answer.as_bytes()),
                    )))
                },
            );
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        })
        .await;
        let http1 = scripted_backend(|mut conn: tokio::net::TcpStream| async move {
            let mut buf = [0u8; 4096];
            while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
        let proxy = proxy_with(ServerOptions {
            request_body_timeout: Duration::from_millis(300),
            ..ServerOptions::default()
        })
        .await;
        let doc = json!({"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/h1"}}],
             "backends": [{"url": url(http1), "weight": 1}]},
            {"backends": [{"url": url(h2c), "weight": 1, "protocol": "h2c"}]},
        ]});
        assert_eq!(push(&client(), proxy.admin_addr(), &doc).await.status, 200);
        let call = |path: &str| {
            format!("POST {path} HTTP/1.1\r\nhost: h\r\ncontent-type: application/grpc\r\ncontent-length: 11\r\n\r\nfirst")
        };
        let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        s.write_all(call("/pkg.Svc/Call").as_bytes())
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(900)).await;
        s.write_all(b"second").await.expect("write");
        let text = read_until(&mut s, "\r\n\r\nok", Duration::from_secs(5)).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
        assert!(text.ends_with("\r\n\r\nok"), "the backend's answer: {text:?}");

        let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        s.write_all(call("/h1/pkg.Svc/Call").as_bytes())
            .await
            .expect("write");
        let text = read_until(&mut s, "\r\n\r\n", Duration::from_secs(5)).await;
        assert!(text.contains("grpc-status: 4\r\n"), "{text:?}");
    })
    .await
    .expect("test finished in time");
}

/// A backend answer framed by `Transfer-Encoding: chunked` that also carries a stale
/// `Content-Length` reaches the client whole: the length goes with the framing (RFC 9112
/// §6.3), where passed on it cut the body short.
#[tokio::test]
async fn a_stale_content_length_beside_chunked_framing_does_not_cut_the_body() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = answering_backend(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n",
        )
        .await;
        let http = client();
        let proxy = proxy_to(&http, backend).await;
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(&r.body[..], b"hello world");
        assert_eq!(r.headers.get(http::header::CONTENT_LENGTH), None);
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 client's cookies, split into one field each (RFC 9113 §8.2.3), reach an
/// HTTP/1.1 backend as one `Cookie` line.
#[tokio::test]
async fn http2_cookie_crumbs_reach_an_http1_backend_as_one_line() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let http = client();
        let proxy = proxy_to(&http, a.http_addr()).await;
        let (mut h2, _task) = connect_h2c::<http_body_util::Full<Bytes>>(proxy.data_addr())
            .await
            .expect("connect");
        let req = http::Request::get("http://h/")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("cookie", "c=3")
            .body(http_body_util::Full::new(Bytes::new()))
            .expect("request");
        let resp = h2.send_request(req).await.expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("body")
            .to_bytes();
        let echoed: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(echoed["headers"]["Cookie"], json!(["a=1; b=2; c=3"]));
    })
    .await
    .expect("test finished in time");
}

/// A client that stops reading its response is dropped once writes to it have been blocked
/// for the send timeout, and the backend connection its request held is let go. A response
/// that is merely slow to come from its backend is not cut by the same timeout.
#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_and_lets_the_backend_go() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
        // `/endless` streams without end until the proxy lets it go, and says so; any other
        // path waits 1.5 s, then answers.
        let backend = scripted_backend(move |mut conn: tokio::net::TcpStream| {
            let gone_tx = gone_tx.clone();
            async move {
                let head = read_head(&mut conn).await;
                if !head.starts_with(b"GET /endless") {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nslow")
                        .await;
                    return;
                }
                stream_without_end(&mut conn).await;
                let _ = gone_tx.send(());
            }
        })
        .await;
        let proxy = proxy_with(ServerOptions {
            auth_token: Some(TOKEN.into()),
            limits: cftunnel_proxy::serve::Limits {
                idle_timeout: Duration::from_millis(200),
                send_timeout: Duration::from_millis(500),
                ..Default::default()
            },
            ..ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();

        let slow = get(&http, d, "h", "/slow", &[]).await;
        assert_eq!(slow.status, StatusCode::OK, "a slow answer is not cut");

        let mut reader = tokio::net::TcpStream::connect(d).await.expect("connect");
        reader
            .write_all(b"GET /endless HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("request sent");
        // It reads nothing; the proxy's writes to it block, and it is dropped.
        tokio::time::timeout(Duration::from_secs(20), gone.recv())
            .await
            .expect("the backend connection is let go")
            .expect("the backend says so");
        drop(reader);
    })
    .await
    .expect("test finished in time");
}

/// `PROXY_SEND_TIMEOUT` sets the listener's send timeout: with 1 s, a client of the binary that
/// stops reading lets its backend connection go within seconds, not after the default 60 s.
#[tokio::test]
async fn the_send_timeout_setting_bounds_the_listener() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
        // Streams without end until the proxy lets it go, and says so.
        let backend = scripted_backend(move |mut conn: tokio::net::TcpStream| {
            let gone_tx = gone_tx.clone();
            async move {
                read_head(&mut conn).await;
                stream_without_end(&mut conn).await;
                let _ = gone_tx.send(());
            }
        })
        .await;
        let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
        let proxy = BinaryProxy::start("send-timeout", &doc, &[("PROXY_SEND_TIMEOUT", "1s")]).await;
        let mut reader = tokio::net::TcpStream::connect(proxy.data)
            .await
            .expect("connect");
        reader
            .write_all(b"GET /endless HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("request sent");
        tokio::time::timeout(Duration::from_secs(20), gone.recv())
            .await
            .expect("the backend connection is let go")
            .expect("the backend says so");
        drop(reader);
        let _ = std::fs::remove_dir_all(&proxy.dir);
    })
    .await
    .expect("test finished in time");
}

/// The admin port holds a bounded number of connections: past it, connections wait to be
/// accepted, and one that closes lets the next in. Each is a task and buffers, and the port
/// must not take the memory and descriptors the data path needs.
#[tokio::test]
async fn the_admin_port_holds_a_bounded_number_of_connections() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            admin_max_connections: 4,
            ..Default::default()
        })
        .await;
        let admin = proxy.admin_addr();
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                tokio::net::TcpStream::connect(admin)
                    .await
                    .expect("connect"),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waiting =
            tokio::spawn(async move { get(&client(), admin, "a", "/healthz", &[]).await.status });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "a fifth connection waits");
        drop(held.pop());
        let status = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("answered once another closes")
            .expect("the request task");
        assert_eq!(status, 200);
    })
    .await
    .expect("test finished in time");
}

/// A body in one-byte chunks, read for a retry, is held in one buffer: replayed byte-exact
/// within the cap, and past the cap sent on with what was read as one piece, not as a
/// frame per byte (which cost about a hundred bytes of memory per byte of body).
#[tokio::test]
async fn a_body_in_one_byte_chunks_is_replayed_exactly_and_sent_on_in_few_frames() {
    use cftunnel_proxy::proxy::MAX_REPLAY_BODY;
    use http_body_util::BodyExt as _;
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Answers the first request to `/retry/small` 503, every other 200; reports each
        // body it was sent and how many frames its first `MAX_REPLAY_BODY` bytes came in.
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let failed_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let backend = scripted_backend(move |conn: tokio::net::TcpStream| {
            let (seen_tx, failed_once) = (seen_tx.clone(), failed_once.clone());
            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let (seen_tx, failed_once) = (seen_tx.clone(), failed_once.clone());
                async move {
                    let path = req.uri().path().to_owned();
                    let mut body = req.into_body();
                    let (mut bytes, mut frames_in_cap) = (Vec::new(), 0usize);
                    while let Some(frame) = body.frame().await {
                        if let Ok(data) = frame?.into_data() {
                            if (bytes.len() as u64) < MAX_REPLAY_BODY {
                                frames_in_cap += 1;
                            }
                            bytes.extend_from_slice(&data);
                        }
                    }
                    let fail = path == "/retry/small"
                        && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst);
                    let _ = seen_tx.send((path, bytes, frames_in_cap));
                    let status = if fail { 503 } else { 200 };
                    Ok::<_, hyper::Error>(
                        http::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(Bytes::new()))
                            .expect("response"),
                    )
                }
            });
            async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .await;
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"retry": {"codes": [503], "attempts": 2},
                                    "backends": [{"url": url(backend), "weight": 1}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);

        let cap = MAX_REPLAY_BODY as usize;
        for (path, length) in [("/retry/small", cap - 1000), ("/retry/large", cap + 5000)] {
            let body: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
            let mut request = format!(
                "POST {path} HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            )
            .into_bytes();
            for byte in &body {
                request.extend_from_slice(b"1\r\n");
                request.push(*byte);
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"0\r\n\r\n");
            let answer = raw(proxy.data_addr(), &request).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {:?}", answer.get(..40));

            let tries = if path == "/retry/small" { 2 } else { 1 };
            for try_ in 1..=tries {
                let (seen_path, sent, frames_in_cap) = seen.recv().await.expect("the backend was sent it");
                assert_eq!(seen_path, path);
                assert!(sent == body, "{path}, try {try_}: the body arrives byte-exact");
                // Within the cap the body is replayed whole; past it, what was read goes on in
                // one chunk (which the backend may read in a few pieces), not a chunk a byte.
                assert!(frames_in_cap <= 64, "{path}, try {try_}: the first {cap} bytes came in {frames_in_cap} frames");
            }
        }
        assert!(seen.try_recv().is_err(), "no more tries than that");
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket backend that echoes what it is sent, or (`flood`) sends 64 KiB messages as
/// fast as it can; it reports on `ended` when the proxy ends its side of a session.
async fn websocket_backend(
    flood: bool,
    ended: tokio::sync::mpsc::UnboundedSender<()>,
) -> std::net::SocketAddr {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    scripted_backend(move |conn: tokio::net::TcpStream| {
        let ended = ended.clone();
        async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(conn).await else {
                return;
            };
            if flood {
                let message = Message::binary(vec![7u8; 64 * 1024]);
                while ws.send(message.clone()).await.is_ok() {}
            } else {
                while let Some(Ok(message)) = ws.next().await {
                    if message.is_close() || ws.send(message).await.is_err() {
                        break;
                    }
                }
            }
            let _ = ended.send(());
        }
    })
    .await
}

async fn websocket_proxy(
    options: ServerOptions,
    backend: std::net::SocketAddr,
) -> cftunnel_proxy::Server {
    let proxy = proxy_with(ServerOptions {
        auth_token: Some(TOKEN.into()),
        ..options
    })
    .await;
    let doc =
        json!({"rules": [{"backends": [{"url": url(backend), "weight": 1, "websocket": true}]}]});
    assert_eq!(
        push(&client(), proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    proxy
}

/// A proxy with `send_timeout` whose one rule goes to `backend` over at most one connection.
async fn proxy_with_one_backend_connection(
    backend: std::net::SocketAddr,
    send_timeout: Duration,
) -> cftunnel_proxy::Server {
    let proxy = proxy_with(ServerOptions {
        auth_token: Some(TOKEN.into()),
        backend_max_connections: 1,
        limits: cftunnel_proxy::serve::Limits {
            send_timeout,
            ..Default::default()
        },
        ..ServerOptions::default()
    })
    .await;
    let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
    assert_eq!(
        push(&client(), proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    proxy
}

/// A WebSocket session with no bytes either way for the idle timeout is ended on both sides;
/// one with traffic is not, however long it lasts.
#[tokio::test]
async fn an_idle_websocket_is_closed_on_both_sides_and_a_busy_one_is_not() {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let idle = Duration::from_millis(300);
        let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
        let backend = websocket_backend(false, ended_tx).await;
        let proxy = websocket_proxy(
            ServerOptions {
                websocket_idle_timeout: Some(idle),
                ..ServerOptions::default()
            },
            backend,
        )
        .await;
        let d = proxy.data_addr();
        // Before the handshake: the proxy's idle clock starts when the session does, before
        // this side has the handshake's answer.
        let opened = std::time::Instant::now();
        let (mut quiet, _) = tokio_tungstenite::connect_async(format!("ws://{d}/ws"))
            .await
            .expect("websocket handshake through the proxy");
        let (mut busy, _) = tokio_tungstenite::connect_async(format!("ws://{d}/ws"))
            .await
            .expect("websocket handshake through the proxy");
        let quiet = tokio::spawn(async move {
            let end = quiet.next().await;
            (end.map(|r| r.map(|m| m.is_close())), opened.elapsed())
        });

        // Four idle timeouts long, a message every third of one.
        while opened.elapsed() < 4 * idle {
            busy.send(Message::text("ping"))
                .await
                .expect("the busy session is open");
            let echoed = busy.next().await.expect("a frame").expect("no error");
            assert_eq!(echoed.into_text().expect("text").as_str(), "ping");
            tokio::time::sleep(idle / 3).await;
        }

        let (end, after) = tokio::time::timeout(Duration::from_secs(5), quiet)
            .await
            .expect("the proxy ends the idle session")
            .expect("task");
        assert!(!matches!(end, Some(Ok(false))), "no message came: {end:?}");
        assert!(after >= idle, "not before the idle timeout: {after:?}");
        tokio::time::timeout(Duration::from_secs(5), ended.recv())
            .await
            .expect("the backend's side of the idle session is ended too");
        assert!(ended.try_recv().is_err(), "the busy session is still open");
        busy.send(Message::text("still here")).await.expect("send");
        let echoed = busy.next().await.expect("a frame").expect("no error");
        assert_eq!(echoed.into_text().expect("text").as_str(), "still here");
        let http = client();
        let gauge = "cftunnel_proxy_websocket_active_sessions";
        assert_eq!(metric(&http, proxy.admin_addr(), gauge).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket client that reads nothing while its backend writes loses its session once the
/// proxy's writes to it have been blocked for the send timeout, idle timeout or not: it would
/// otherwise hold its place, and its backend's handler, until a peer gave up.
#[tokio::test]
async fn a_websocket_client_that_never_reads_is_closed_after_the_send_timeout() {
    use futures_util::StreamExt as _;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
        let backend = websocket_backend(true, ended_tx).await;
        let proxy = websocket_proxy(
            ServerOptions {
                websocket_idle_timeout: None,
                limits: cftunnel_proxy::serve::Limits {
                    send_timeout: Duration::from_millis(500),
                    ..Default::default()
                },
                ..ServerOptions::default()
            },
            backend,
        )
        .await;
        let (mut ws, _) =
            tokio_tungstenite::connect_async(format!("ws://{}/ws", proxy.data_addr()))
                .await
                .expect("websocket handshake through the proxy");
        tokio::time::timeout(Duration::from_secs(20), ended.recv())
            .await
            .expect("the proxy ends the backend's side");
        let http = client();
        let gauge = "cftunnel_proxy_websocket_active_sessions";
        let zero_by = std::time::Instant::now() + Duration::from_secs(5);
        while metric(&http, proxy.admin_addr(), gauge).await != Some(0.0) {
            assert!(std::time::Instant::now() < zero_by, "the session is over");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // What the proxy had sent the client is there to read, then the end of the stream.
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            let mut messages = 0usize;
            while let Some(Ok(_)) = ws.next().await {
                messages += 1;
            }
            messages
        })
        .await
        .expect("the client's side is ended");
        assert!(
            drained > 0,
            "the backend's messages reached the client until it stopped reading"
        );
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 client connection to `addr` that opens each stream's window `window` bytes wide,
/// reads the socket and answers PINGs.
async fn h2_window_client(
    addr: std::net::SocketAddr,
    window: u32,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

/// A GET over `sender`, answered with its head.
async fn h2_fetch(
    sender: &mut h2::client::SendRequest<Bytes>,
    path: &str,
) -> http::Response<h2::RecvStream> {
    let req = http::Request::get(format!("http://h{path}"))
        .body(())
        .expect("request");
    let (answer, _) = sender
        .clone()
        .ready()
        .await
        .expect("ready")
        .send_request(req, true)
        .expect("request sent");
    answer.await.expect("a response head")
}

/// An HTTP/2 client that keeps a stream's flow-control window shut, while it reads the socket
/// and answers PINGs, cannot hold the backend connection the stream's response comes on for
/// longer than the send timeout: the proxy gives up on it, and with one connection allowed
/// to the backend a following request is answered.
#[tokio::test]
async fn an_http2_client_that_keeps_a_window_shut_lets_the_backend_go() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
        // `/big` answers 1 MiB and says when the proxy lets its connection go; any other
        // path answers at once.
        let backend = scripted_backend(move |mut conn: tokio::net::TcpStream| {
            let gone_tx = gone_tx.clone();
            async move {
                loop {
                    let head = read_head(&mut conn).await;
                    if !head.starts_with(b"GET /big") {
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nsmall";
                        if conn.write_all(answer).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1048576\r\n\r\n".to_vec();
                    answer.resize(answer.len() + (1 << 20), b'x');
                    let _ = conn.write_all(&answer).await;
                    let mut buf = [0u8; 1024];
                    while conn.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                    let _ = gone_tx.send(());
                    return;
                }
            }
        })
        .await;
        let proxy = proxy_with_one_backend_connection(backend, Duration::from_millis(500)).await;
        let d = proxy.data_addr();

        let (mut shut, _task) = h2_window_client(d, 0).await;
        let answer = h2_fetch(&mut shut, "/big").await;
        assert_eq!(answer.status(), StatusCode::OK);
        let mut body = answer.into_body();
        // Nothing may be sent on the stream; the proxy resets it or closes the connection.
        let ended = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("the proxy gives up on the stream within the send timeout");
        assert!(
            !matches!(ended, Some(Ok(_))),
            "no data is sent through a shut window"
        );
        tokio::time::timeout(Duration::from_secs(5), gone.recv())
            .await
            .expect("the backend connection is let go")
            .expect("the backend says so");

        let next = tokio::time::timeout(
            Duration::from_secs(5),
            get(&client(), d, "h", "/small", &[]),
        )
        .await
        .expect("the next request gets the backend connection");
        assert_eq!(next.status, StatusCode::OK);
        assert_eq!(&next.body[..], b"small");
    })
    .await
    .expect("test finished in time");
}

/// Over HTTP/2, a response that is slow to come from its backend, and one that a client reads
/// slowly but steadily, are not cut by the send timeout.
#[tokio::test]
async fn slow_http2_responses_that_progress_are_not_cut() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // `/slow` sends a chunk, waits three send timeouts, then ends; `/steady` sends
        // 512 KiB at once.
        let backend = scripted_backend(move |mut conn: tokio::net::TcpStream| async move {
            loop {
                let head = read_head(&mut conn).await;
                let sent = if head.starts_with(b"GET /slow") {
                    let head =
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
                    match conn.write_all(head).await {
                        Ok(()) => {
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            conn.write_all(b"4\r\nlast\r\n0\r\n\r\n").await
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 524288\r\n\r\n".to_vec();
                    answer.resize(answer.len() + (512 << 10), b'x');
                    conn.write_all(&answer).await
                };
                if sent.is_err() {
                    return;
                }
            }
        })
        .await;
        let proxy = proxy_with_one_backend_connection(backend, Duration::from_millis(500)).await;
        let (mut h2, _task) = h2_window_client(proxy.data_addr(), 65_535).await;

        let mut body = h2_fetch(&mut h2, "/slow").await.into_body();
        let mut got = Vec::new();
        while let Some(data) = body.data().await {
            let data = data.expect("the slow response is not cut");
            body.flow_control()
                .release_capacity(data.len())
                .expect("capacity released");
            got.extend_from_slice(&data);
        }
        assert_eq!(got, b"firstlast");

        // 16 KiB every 50 ms: the window opens again every 100 ms, for about 1.6 s.
        let mut body = h2_fetch(&mut h2, "/steady").await.into_body();
        let mut got = 0;
        while let Some(data) = body.data().await {
            let data = data.expect("the steadily read response is not cut");
            got += data.len();
            tokio::time::sleep(Duration::from_millis(50)).await;
            body.flow_control()
                .release_capacity(data.len())
                .expect("capacity released");
        }
        assert_eq!(got, 512 << 10);
    })
    .await
    .expect("test finished in time");
}
