//! End to end: backend behaviour. Failures and fail-closed answers, retries, timeouts,
//! mirrors, weights, WebSocket, h2c and TLS upstreams, the in-flight gauge, client limits.

use crate::support::*;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rule(prefix: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut r = json!({"matches": [{"path": {"type": "PathPrefix", "value": prefix}}]});
    if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
        r.extend(extra.clone());
    }
    r
}

#[tokio::test]
async fn failures_answer_502_503_504_and_500_and_never_hang() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let (dead, _held) = dead_addr();
        let doc = json!({"rules": [
            rule("/dead", json!({"backends": [{"url": url(dead), "weight": 1}]})),
            rule("/closed", json!({"unavailableStatus": 503, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/refused", json!({"backends": [{"url": "", "weight": 1, "unavailableStatus": 500}]})),
            rule("/none", json!({"backends": []})),
            rule("/zero", json!({"backends": [{"url": url(a.http_addr()), "weight": 0}]})),
            rule("/slow-backend", json!({"timeouts": {"backend": "200ms"}, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/slow-request", json!({"timeouts": {"request": "300ms"}, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/no-timeout", json!({"timeouts": {"request": "0s"}, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();
        assert_eq!(get(&http, d, "h", "/dead", &[]).await.status, StatusCode::BAD_GATEWAY);
        assert_eq!(get(&http, d, "h", "/closed", &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get(&http, d, "h", "/refused", &[]).await.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(get(&http, d, "h", "/none", &[]).await.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(get(&http, d, "h", "/zero", &[]).await.status, StatusCode::INTERNAL_SERVER_ERROR);
        let started = std::time::Instant::now();
        assert_eq!(get(&http, d, "h", "/slow-backend?delay=2s", &[]).await.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(get(&http, d, "h", "/slow-request?delay=2s", &[]).await.status, StatusCode::GATEWAY_TIMEOUT);
        assert!(started.elapsed() < Duration::from_millis(1800), "timeouts cut the wait short");
        assert_eq!(get(&http, d, "h", "/no-timeout?delay=300ms", &[]).await.status, StatusCode::OK, "0s disables the timeout");
        assert_eq!(get(&http, d, "h", "/closed", &[]).await.body, Bytes::from_static(b"route backend is unavailable\n"));

        let admin = proxy.admin_addr();
        assert_eq!(metric(&http, admin, "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"dial\"}").await, Some(1.0));
        // The backend timeout and the request timeout that ran out waiting on the backend.
        assert_eq!(metric(&http, admin, "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"timeout\"}").await, Some(2.0));
        assert!(metric(&http, admin, "cftunnel_proxy_requests_total{hostname=\"*\",status_class=\"5xx\"}").await >= Some(7.0));

        let grpc = Request::post(format!("http://{d}/nowhere"))
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::new()))
            .expect("req");
        push(&http, admin, &json!({"rules": [rule("/only", json!({"backends": []}))]})).await;
        let r = send(&http, grpc).await;
        assert_eq!(r.header("grpc-status"), Some("12"), "unmatched gRPC gets UNIMPLEMENTED");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn retries_follow_codes_and_attempts_and_connection_errors() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/retry/code-500", json!({"retry": {"codes": [500], "attempts": 3, "backoff": "10ms"}, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/retry/none", json!({"backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/retry/slow", json!({"retry": {"attempts": 2}, "timeouts": {"backend": "200ms"}, "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
        ]});
        push(&http, proxy.admin_addr(), &doc).await;
        let d = proxy.data_addr();
        let r = get(&http, d, "h", "/retry/code-500?responseCode=500&succeedAfter=2&uuid=u1", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "third try succeeds");
        let r = get(&http, d, "h", "/retry/code-500?responseCode=500&succeedAfter=4&uuid=u2", &[]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "1 + 3 tries are not enough");
        let r = get(&http, d, "h", "/retry/code-500?responseCode=503&succeedAfter=1&uuid=u3", &[]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "503 is not a listed code");
        let r = get(&http, d, "h", "/retry/code-500?succeedAfter=2&uuid=u4", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "connection resets are retried");
        let r = get(&http, d, "h", "/retry/code-500?succeedAfter=9&uuid=u7", &[]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "resets on every try end in 503");
        let r = get(&http, d, "h", "/retry/slow?delayRetry=300ms&responseCode=500&succeedAfter=2&uuid=u8", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "per-try timeouts are retried");
        let r = get(&http, d, "h", "/retry/slow?delayRetry=300ms&responseCode=500&succeedAfter=3&uuid=u9", &[]).await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "and answer 504 when every try timed out");
        let r = get(&http, d, "h", "/retry/none?responseCode=500&succeedAfter=1&uuid=u5", &[]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "no retry without a policy");

        // A body is replayed on retry.
        let post = Request::post(format!("http://{d}/retry/code-500?responseCode=500&succeedAfter=1&uuid=u6"))
            .body(Full::new(Bytes::from_static(b"payload")))
            .expect("req");
        assert_eq!(send(&http, post).await.status, StatusCode::OK);
    })
    .await
    .expect("test finished in time");
}

/// A rule asking for more retries than its backend's budget holds gets the budget's: against a
/// backend that fails every try, a thousand retries a request do not become a thousand tries.
#[tokio::test]
async fn retries_stop_at_the_backends_budget() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tries = std::sync::Arc::new(AtomicUsize::new(0));
        let seen = tries.clone();
        let backend = scripted_backend(move |mut s| {
            let seen = seen.clone();
            async move {
                let mut buf = Vec::new();
                while next_request_head(&mut s, &mut buf).await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let answer =
                        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [rule("/", json!({"retry": {"codes": [503], "attempts": 1000},
            "backends": [{"url": url(backend), "weight": 1}]}))]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        assert_eq!(
            (r.status, &r.body[..]),
            (StatusCode::SERVICE_UNAVAILABLE, &b"busy"[..])
        );
        let n = tries.load(Ordering::SeqCst);
        // One try and the hundred retries a new backend's full budget holds, and the ten a
        // second that time adds while they run (a loaded machine may take seconds over them):
        // far from the thousand and one the rule asks for.
        assert!((101..=400).contains(&n), "{n} tries");
        let over = "cftunnel_proxy_retries_over_budget_total";
        assert_eq!(metric(&http, proxy.admin_addr(), over).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn mirrors_get_a_copy_and_weights_split_traffic() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, b, m) = (echo("svc-a-1").await, echo("svc-b-1").await, echo("mirror-1").await);
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/mirror", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.http_addr())}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/mirror-h2c", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.h2c_addr()), "protocol": "h2c"}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/never-mirrored", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.http_addr()), "percent": 0}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
            rule("/weighted", json!({"backends": [
                {"url": url(a.http_addr()), "weight": 1}, {"url": url(b.http_addr()), "weight": 3}]})),
            // `fraction` takes precedence over the `percent` written for older proxies.
            rule("/quarter", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.http_addr()), "percent": 100, "fraction": {"numerator": 1, "denominator": 4}}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
        ]});
        push(&http, proxy.admin_addr(), &doc).await;
        let d = proxy.data_addr();
        let r = get(&http, d, "h", "/mirror?id=1", &[]).await;
        assert_eq!(r.pod(), "svc-a-1", "the client gets the primary backend's answer");
        let mut seen = 0;
        for _ in 0..100 {
            seen = m.count_echoed("/mirror?id=1");
            if seen > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, 1, "the mirror saw the request");
        // A mirror spoken to over h2c: its HTTP/2-only port sees the copy.
        let r = get(&http, d, "h", "/mirror-h2c?id=2", &[]).await;
        assert_eq!(r.pod(), "svc-a-1");
        let mut seen = 0;
        for _ in 0..100 {
            seen = m.count_echoed("/mirror-h2c?id=2");
            if seen > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, 1, "the h2c mirror saw the request");
        for _ in 0..20 {
            get(&http, d, "h", "/never-mirrored", &[]).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(m.count_echoed("/never-mirrored"), 0);

        let mut to_b = 0;
        const N: usize = 400;
        for _ in 0..N {
            if get(&http, d, "h", "/weighted", &[]).await.pod() == "svc-b-1" {
                to_b += 1;
            }
        }
        let share = to_b as f64 / N as f64;
        assert!((share - 0.75).abs() < 0.08, "weight 3 of 4 got {share}");

        for _ in 0..N {
            get(&http, d, "h", "/quarter", &[]).await;
        }
        // Copies arrive after the answers: counted once the count stops moving.
        let mut copies = m.count_echoed("/quarter");
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = m.count_echoed("/quarter");
            if now == copies {
                break;
            }
            copies = now;
        }
        // 100 expected; the bounds are six standard deviations off.
        assert!((50..=160).contains(&copies), "1 in 4 of {N} copied: {copies}");
    })
    .await
    .expect("test finished in time");
}

/// A streaming request on a rule that mirrors or retries (a bidirectional call, a chunked
/// upload that waits for the answer) reaches its backend while its body is still open: the
/// body is read for a copy only until it pauses, then streams on, sent once and not mirrored.
#[tokio::test]
async fn a_streaming_body_on_a_mirrored_or_retried_rule_is_not_held_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let m = echo("mirror-1").await;
        let backend = answering_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/mirrored", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m.http_addr())}}],
                "backends": [{"url": url(backend), "weight": 1}]})),
            rule("/retried", json!({"retry": {"codes": [503], "attempts": 2},
                "backends": [{"url": url(backend), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, 200);
        for path in ["/mirrored", "/retried"] {
            let mut s = tokio::net::TcpStream::connect(proxy.data_addr())
                .await
                .expect("connect");
            // One chunk, and the body left open.
            s.write_all(
                format!("POST {path} HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n4\r\nping\r\n")
                    .as_bytes(),
            )
            .await
            .expect("write");
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            let answered = tokio::time::timeout(Duration::from_secs(3), async {
                while !String::from_utf8_lossy(&got).contains("ok") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            let text = String::from_utf8_lossy(&got);
            assert!(
                answered.is_ok() && text.starts_with("HTTP/1.1 200"),
                "{path}: {text:?}"
            );
        }
    })
    .await
    .expect("test finished in time");
}

/// A mirror that answers without end is read only so far and then cut off, instead of being
/// held in memory until the mirror's timeout.
#[tokio::test]
async fn a_mirror_answering_without_end_is_cut_off() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mirror = listener.local_addr().expect("addr");
        let written = Arc::new(AtomicUsize::new(0));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let count = written.clone();
        tokio::spawn(async move {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head).await;
            let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
            let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            while conn.write_all(&out).await.is_ok() {
                count.fetch_add(out.len(), Ordering::Relaxed);
                out = chunk.clone().into_bytes();
            }
            let _ = done_tx.send(());
        });
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/mirror", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": format!("http://{mirror}")}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
        ]});
        push(&http, proxy.admin_addr(), &doc).await;
        let r = get(&http, proxy.data_addr(), "h", "/mirror", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        // Well before the mirror's 10 s timeout.
        tokio::time::timeout(Duration::from_secs(5), done_rx)
            .await
            .expect("the proxy stops reading the mirror's answer")
            .expect("the mirror finished");
        let sent = written.load(Ordering::Relaxed);
        assert!(sent < 64 * 1024 * 1024, "{sent} bytes reached the proxy's socket");
    })
    .await
    .expect("test finished in time");
}

/// A response still streaming holds its hostname's metrics, not the table it started on: a
/// table replaced by a push is freed while long streams (gRPC, server-sent events) go on.
#[tokio::test]
async fn a_streaming_response_does_not_hold_a_replaced_table() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let backend = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                .await;
            // The stream stays open until the test ends.
            let _ = conn.read(&mut head).await;
        });
        let proxy = proxy().await;
        let http = client();
        let doc = |version: i64| {
            json!({"version": version, "rules": [
                {"backends": [{"url": format!("http://{backend}"), "weight": 1}]},
            ]})
        };
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc(1)).await.status,
            StatusCode::OK
        );
        let first = std::sync::Arc::downgrade(&proxy.proxy().routes());

        let mut client = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        client
            .write_all(b"GET /events HTTP/1.1\r\nhost: h\r\n\r\n")
            .await
            .expect("request sent");
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("first") {
            let n = client.read(&mut buf).await.expect("read");
            assert!(n > 0, "the proxy closed the stream");
            seen.extend_from_slice(&buf[..n]);
        }

        assert_eq!(
            push(&http, proxy.admin_addr(), &doc(2)).await.status,
            StatusCode::OK
        );
        let by = tokio::time::Instant::now() + Duration::from_secs(5);
        while first.upgrade().is_some() {
            assert!(
                tokio::time::Instant::now() < by,
                "the replaced table is still held"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(client);
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn websocket_and_h2c_backends_work_end_to_end() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/ws", json!({"backends": [{"url": url(a.http_addr()), "weight": 1, "websocket": true}]})),
            rule("/h2c-rewritten", json!({"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "rewritten.example"}}],
                "backends": [{"url": url(a.h2c_addr()), "weight": 1, "protocol": "h2c"}]})),
            rule("/h2c", json!({"backends": [{"url": url(a.h2c_addr()), "weight": 1, "protocol": "h2c"}]})),
        ]});
        push(&http, proxy.admin_addr(), &doc).await;
        let d = proxy.data_addr();

        let r = get(&http, d, "h", "/h2c/x", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["proto"], "HTTP/2.0", "the backend was spoken to in h2c");
        assert_eq!(r.json()["path"], "/h2c/x");
        // An HTTP/2 backend reads the host from `:authority`: the client's, or the rewrite's.
        assert_eq!(r.json()["host"], "h");
        let r = get(&http, d, "h", "/h2c-rewritten", &[]).await;
        assert_eq!(r.json()["host"], "rewritten.example");
        // Whatever hosts clients send, the requests share one multiplexed connection.
        for i in 0..10 {
            let r = get(&http, d, &format!("h{i}.example"), "/h2c/pool", &[]).await;
            assert_eq!(r.json()["host"], format!("h{i}.example"));
        }
        let peers: std::collections::HashSet<String> = a
            .log_lines()
            .iter()
            .filter(|l| l.contains("/h2c"))
            .filter_map(|l| l.rsplit_once('(').map(|(_, p)| p.to_owned()))
            .collect();
        assert_eq!(peers.len(), 1, "one h2c connection: {peers:?}");

        let mut ws = websocket_echoing(&format!("ws://{d}/ws"), "hello").await;
        ws.send(tokio_tungstenite::tungstenite::Message::binary(vec![1u8, 2, 3])).await.expect("send");
        let echoed = ws.next().await.expect("a frame").expect("no error");
        assert_eq!(echoed.into_data().as_ref(), &[1u8, 2, 3]);
        assert_eq!(metric(&http, proxy.admin_addr(), "cftunnel_proxy_websocket_active_sessions").await, Some(1.0));
        ws.close(None).await.expect("close");
    })
    .await
    .expect("test finished in time");
}

/// Whether a connection's first bytes are the HTTP/2 preface (h2c with prior knowledge), read
/// without taking them; `None` if it ends first.
async fn speaks_h2c(conn: &tokio::net::TcpStream) -> Option<bool> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut first = [0u8; 24];
    let mut seen = 0;
    while seen < first.len() {
        match conn.peek(&mut first).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => seen = n,
        }
    }
    Some(first == PREFACE)
}

/// A backend that speaks h2c and HTTP/1.1 on one port, as Go's `h2c.NewHandler` does: HTTP/2
/// requests are answered `h2`, HTTP/1.1 WebSocket handshakes open an echoing session.
async fn h2c_and_websocket_backend() -> std::net::SocketAddr {
    scripted_backend(|conn: tokio::net::TcpStream| async move {
        let Some(h2c) = speaks_h2c(&conn).await else {
            return;
        };
        if h2c {
            let service = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                    Bytes::from_static(b"h2"),
                )))
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                .await;
            return;
        }
        let Ok(mut ws) = tokio_tungstenite::accept_async(conn).await else {
            return;
        };
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() || ws.send(message).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// A backend marked both `h2c` and `websocket` (a Service port with `appProtocol:
/// kubernetes.io/h2c` served by a server that also takes WebSockets on it) gets its requests
/// over HTTP/2 and its WebSocket handshakes over HTTP/1.1, which alone carries an upgrade.
#[tokio::test]
async fn an_h2c_backend_that_takes_websockets_gets_them_over_http1() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = h2c_and_websocket_backend().await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/", json!({"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c", "websocket": true}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();
        let r = get(&http, d, "h", "/plain", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"h2"[..]), "spoken to over HTTP/2");

        let mut ws = websocket_echoing(&format!("ws://{d}/ws"), "hello").await;
        ws.close(None).await.expect("close");
    })
    .await
    .expect("test finished in time");
}

/// At an h2c backend's connection limit, HTTP/1.1 connections left idle by WebSocket
/// handshakes it refused give their places to HTTP/2 requests instead of holding them until
/// their idle timeout.
#[tokio::test]
async fn idle_upgrade_connections_give_way_to_http2_requests_at_the_limit() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Each WebSocket handshake is refused (403, the connection kept open) once two have
        // arrived, so the two go out on two connections; HTTP/2 requests get `h2`.
        let arrived = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let backend = scripted_backend(move |conn: tokio::net::TcpStream| {
            let arrived = arrived.clone();
            async move {
                let Some(h2c) = speaks_h2c(&conn).await else {
                    return;
                };
                let io = hyper_util::rt::TokioIo::new(conn);
                if h2c {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"h2"))))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                    return;
                }
                let service = hyper::service::service_fn(move |_req| {
                    let arrived = arrived.clone();
                    async move {
                        arrived.wait().await;
                        let mut refused = hyper::Response::new(Full::new(Bytes::from_static(b"no")));
                        *refused.status_mut() = StatusCode::FORBIDDEN;
                        Ok::<_, std::convert::Infallible>(refused)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            }
        })
        .await;
        let proxy = limited_proxy(2).await;
        let http = client();
        let doc = json!({"rules": [rule("/", json!({
            "timeouts": {"request": "5s"},
            "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c", "websocket": true}]}))]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let handshake = [
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        let refused = futures_util::future::join_all((0..2).map(|_| {
            let http = http.clone();
            async move { get(&http, d, "h", "/ws", &handshake).await }
        }))
        .await;
        for r in refused {
            assert_eq!((r.status, &r.body[..]), (StatusCode::FORBIDDEN, &b"no"[..]), "the handshake is refused");
        }

        // Both places at the limit are now idle HTTP/1.1 connections.
        let r = get(&http, d, "h", "/plain", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"h2"[..]), "served over HTTP/2 within its timeout");
    })
    .await
    .expect("test finished in time");
}

/// A WebSocket handshake on a rule with a RequestMirror is not copied to the mirror: a copy
/// would open a session there only to drop it at once. Other requests still are.
#[tokio::test]
async fn websocket_handshakes_are_not_mirrored() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        // A mirror that notes each request line it gets and answers 200.
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let noted = lines.clone();
        let m = scripted_backend(move |mut conn: tokio::net::TcpStream| {
            let noted = noted.clone();
            async move {
                while let Some(head) = request_head(&mut conn).await {
                    let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_owned();
                    noted.lock().expect("lines").push(line);
                    if conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        let seen = |path: &str| lines.lock().expect("lines").iter().filter(|l| l.contains(path)).count();
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/", json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(m)}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1, "websocket": true}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();
        let mut ws = websocket_echoing(&format!("ws://{d}/ws?id=1"), "hello").await;
        ws.close(None).await.expect("close");
        // A request after it is mirrored; by the time the mirror has it, a copy of the
        // handshake sent before would have arrived too.
        let r = get(&http, d, "h", "/after?id=2", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        let by = std::time::Instant::now() + Duration::from_secs(5);
        while seen("/after?id=2") == 0 {
            assert!(std::time::Instant::now() < by, "the mirror gets other requests");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen("/ws?id=1"), 0, "the handshake was not mirrored");
    })
    .await
    .expect("test finished in time");
}

/// A TLS acceptor for `backend.internal` offering `alpn`, with a certificate signed by a new
/// private CA, and that CA as PEM.
fn backend_tls(alpn: &[&[&[u8]]]) -> (Vec<tokio_rustls::TlsAcceptor>, String) {
    let pki = cftunnel_testkit::pki::TestPki::for_names(&["backend.internal"]).expect("PKI");
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let acceptors = alpn
        .iter()
        .map(|protocols| {
            let mut config = pki.tcp_server(provider.clone()).expect("server config");
            config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
            tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
        })
        .collect();
    (acceptors, pki.ca_pem().to_owned())
}

/// A TLS backend with a certificate for `backend.internal` signed by a private CA, and the
/// path of every request it is sent, as it reads them.
async fn tls_backend() -> (
    std::net::SocketAddr,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (acceptors, ca) = backend_tls(&[&[]]);
    let acceptor = acceptors[0].clone();
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    let addr = scripted_backend(move |tcp| {
        let acceptor = acceptor.clone();
        let seen_tx = seen_tx.clone();
        async move {
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let Ok(n) = tls.read(&mut buf).await else {
                return;
            };
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
            let _ = seen_tx.send(path.clone());
            let body = format!("{{\"path\":\"{path}\",\"pod\":\"tls-1\"}}");
            let resp = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            let _ = tls.write_all(resp.as_bytes()).await;
            let _ = tls.shutdown().await;
        }
    })
    .await;
    (addr, ca, seen)
}

#[tokio::test]
async fn tls_backends_verify_against_the_configured_ca_and_names() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (addr, ca, _) = tls_backend().await;
        let proxy = proxy().await;
        let http = client();
        let https = format!("https://127.0.0.1:{}", addr.port());
        let doc = json!({"rules": [
            rule("/sni", json!({"backends": [{"url": https, "weight": 1, "tls": {"caBundle": ca, "serverName": "backend.internal"}}]})),
            rule("/san", json!({"backends": [{"url": https, "weight": 1, "tls": {"caBundle": ca, "subjectAltNames": ["other.internal", "backend.internal"]}}]})),
            rule("/wrong-name", json!({"backends": [{"url": https, "weight": 1, "tls": {"caBundle": ca, "serverName": "impostor.internal"}}]})),
            rule("/public-roots", json!({"backends": [{"url": https, "weight": 1, "tls": {"serverName": "backend.internal"}}]})),
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();
        let r = get(&http, d, "h", "/sni/x", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["path"], "/sni/x");
        assert_eq!(get(&http, d, "h", "/san", &[]).await.status, StatusCode::OK);
        assert_eq!(get(&http, d, "h", "/wrong-name", &[]).await.status, StatusCode::BAD_GATEWAY);
        assert_eq!(get(&http, d, "h", "/public-roots", &[]).await.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            metric(&http, proxy.admin_addr(), "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"tls\"}").await,
            Some(2.0)
        );
    })
    .await
    .expect("test finished in time");
}

/// A TLS backend for `backend.internal` that offers `h2` through ALPN while `h2` is set (else
/// HTTP/1.1 only) and answers JSON with the protocol, the host it read (`:authority` on
/// HTTP/2, else `Host`), the request target and the client's port. `close` drops every open
/// connection.
struct AlpnBackend {
    addr: std::net::SocketAddr,
    ca: String,
    h2: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AlpnBackend {
    async fn start() -> Self {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use std::sync::atomic::Ordering;
        let (acceptors, ca) = backend_tls(&[&[b"h2", b"http/1.1"], &[b"http/1.1"]]);
        let (with_h2, h1_only) = (acceptors[0].clone(), acceptors[1].clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let h2 = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (offer, tasks, count) = (h2.clone(), conns.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = if offer.load(Ordering::SeqCst) {
                    with_h2.clone()
                } else {
                    h1_only.clone()
                };
                let task = tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |mut req: Request<hyper::body::Incoming>| async move {
                            if let Some(key) = req.headers().get("sec-websocket-key").cloned() {
                                return Ok(websocket_echo(&mut req, key.as_bytes()));
                            }
                            let host = req.uri().authority().map(|a| a.to_string()).or_else(|| {
                                req.headers()
                                    .get(http::header::HOST)
                                    .and_then(|h| h.to_str().ok())
                                    .map(str::to_owned)
                            });
                            let body = json!({"proto": format!("{:?}", req.version()), "host": host,
                            "target": req.uri().to_string(), "port": peer.port()});
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from(body.to_string()),
                            )))
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                });
                if let Ok(mut t) = tasks.lock() {
                    t.push(task.abort_handle());
                }
            }
        });
        Self {
            addr,
            ca,
            h2,
            conns,
            accepted,
        }
    }

    /// TLS connections accepted so far (still open or not).
    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn offer_h2(&self, on: bool) {
        self.h2.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops every open connection and gives the proxy a moment to see them close.
    async fn close(&self) {
        for task in self
            .conns
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
        {
            task.abort();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Accepts a WebSocket handshake and echoes the messages that follow.
fn websocket_echo(
    req: &mut Request<hyper::body::Incoming>,
    key: &[u8],
) -> http::Response<Full<Bytes>> {
    use tokio_tungstenite::tungstenite::{handshake::derive_accept_key, protocol::Role};
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(io) = upgrade.await else { return };
        let io = hyper_util::rt::TokioIo::new(io);
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None).await;
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() || ws.send(msg).await.is_err() {
                return;
            }
        }
    });
    http::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", derive_accept_key(key))
        .body(Full::new(Bytes::new()))
        .expect("101 response")
}

#[tokio::test]
async fn tls_backends_get_the_requests_host_over_http2_and_http1() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = AlpnBackend::start().await;
        let proxy = proxy().await;
        let http = client();
        let tls = json!({"caBundle": backend.ca, "serverName": "backend.internal"});
        let https = format!("https://127.0.0.1:{}", backend.addr.port());
        let doc = json!({"rules": [
            rule("/rewritten", json!({"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "rewritten.example"}}],
                "backends": [{"url": https, "weight": 1, "tls": tls}]})),
            rule("/", json!({"backends": [{"url": https, "weight": 1, "tls": tls}]})),
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();
        let ports = |replies: &[serde_json::Value]| {
            replies.iter().map(|j| j["port"].as_u64()).collect::<std::collections::HashSet<_>>()
        };

        // The backend picks h2: every request carries its own host as `:authority`, and all
        // hosts share one multiplexed connection, dialed once for a first burst.
        let replies = futures_util::future::join_all((0..10).map(|i| {
            let http = http.clone();
            async move {
                let r = get(&http, d, &format!("h{i}.example"), "/x?q=1", &[]).await;
                assert_eq!(r.status, StatusCode::OK);
                let j = r.json();
                assert_eq!((j["proto"].as_str(), j["host"].as_str()), (Some("HTTP/2.0"), Some(format!("h{i}.example").as_str())));
                assert_eq!(j["target"], format!("https://h{i}.example/x?q=1"));
                j
            }
        }))
        .await;
        assert_eq!(ports(&replies).len(), 1, "one connection: {replies:?}");
        assert_eq!(backend.accepted(), 1, "one TLS handshake");

        // HTTP/2 cannot carry an upgrade: a WebSocket to the same backend goes over a
        // connection of its own that offers HTTP/1.1 only.
        let mut ws = websocket_echoing(&format!("ws://{d}/ws"), "over TLS").await;
        ws.close(None).await.expect("close");
        assert_eq!(backend.accepted(), 2, "one more TLS connection, for the upgrade");
        let r = get(&http, d, "after.example", "/x", &[]).await;
        assert_eq!(r.json()["proto"], "HTTP/2.0", "other requests stay on HTTP/2");
        let r = get(&http, d, "h", "/rewritten", &[]).await;
        assert_eq!(r.json()["host"], "rewritten.example");

        // It now answers HTTP/1.1 only: the same host arrives in `Host`, with an origin-form
        // target, on keep-alive connections; a burst at the switch is served too.
        backend.offer_h2(false);
        backend.close().await;
        let burst = futures_util::future::join_all((0..10).map(|i| {
            let http = http.clone();
            async move { get(&http, d, &format!("b{i}.example"), "/burst", &[]).await }
        }))
        .await;
        for r in burst {
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
            assert_eq!(r.json()["proto"], "HTTP/1.1");
        }
        let mut replies = Vec::new();
        for i in 0..5 {
            let r = get(&http, d, &format!("h{i}.example"), "/y", &[]).await;
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
            let j = r.json();
            assert_eq!((j["proto"].as_str(), j["host"].as_str()), (Some("HTTP/1.1"), Some(format!("h{i}.example").as_str())));
            assert_eq!(j["target"], "/y");
            replies.push(j);
        }
        assert!(ports(&replies).len() <= 10, "reused connections: {replies:?}");
        let r = get(&http, d, "h", "/rewritten", &[]).await;
        assert_eq!(r.json()["host"], "rewritten.example");

        // And h2 again once that connection is gone.
        backend.offer_h2(true);
        backend.close().await;
        let r = get(&http, d, "back.example", "/z", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!((r.json()["proto"].as_str(), r.json()["host"].as_str()), (Some("HTTP/2.0"), Some("back.example")));
    })
    .await
    .expect("test finished in time");
}

/// A TLS backend for `backend.internal` offering `alpn`, that reads each request's whole body
/// before it answers `read <n> bytes`, a second later on a path ending in `/slow`.
async fn tls_body_reader(alpn: &[&[u8]]) -> (std::net::SocketAddr, String) {
    use http_body_util::BodyExt as _;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let (acceptors, ca) = backend_tls(&[alpn]);
    let acceptor = acceptors[0].clone();
    let addr = scripted_backend(move |tcp| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service =
                hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let slow = req.uri().path().ends_with("/slow");
                    let body = req.into_body().collect().await?.to_bytes();
                    if slow {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    let answer = format!("read {} bytes", body.len());
                    Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(answer))))
                });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        }
    })
    .await;
    (addr, ca)
}

/// A gRPC call to a TLS backend offered `h2` that picks HTTP/1.1, whose body the backend stops
/// taking, gets the HTTP/1.1 bound (the default wait, 500 ms here) as a backend slow to answer
/// does: not as long as its client keeps sending.
#[tokio::test]
async fn a_grpc_upload_a_tls_backend_stops_taking_times_out() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (acceptors, ca) = backend_tls(&[&[b"http/1.1"]]);
        let acceptor = acceptors[0].clone();
        // Reads the start of the request, then nothing.
        let backend = scripted_backend(move |tcp| {
            let acceptor = acceptor.clone();
            async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = [0u8; 1024];
                let _ = tls.read(&mut head).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
                drop(tls);
            }
        })
        .await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_header_timeout: Duration::from_millis(500),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let tls = json!({"caBundle": ca, "serverName": "backend.internal"});
        let to = json!({"backends": [{"url": format!("https://127.0.0.1:{}", backend.port()), "weight": 1, "tls": tls}]});
        let r = push(&http, proxy.admin_addr(), &json!({"rules": [rule("/up", to)]})).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

        let (answer, took) = answer_to_a_held_upload(
            proxy.data_addr(),
            "POST /up/pkg.Svc/Call HTTP/1.1\r\nhost: h\r\ncontent-type: application/grpc\r\n",
            64 * 1024 * 1024,
        )
        .await;
        let answer = answer.to_lowercase();
        assert!(answer.contains("grpc-status: 4"), "{answer}");
        assert!(took < Duration::from_secs(5), "at the bound: {took:?}");
    })
    .await
    .expect("test finished in time");
}

/// A gRPC call may be quiet only where it goes over HTTP/2. To a TLS backend that answers ALPN
/// with `http/1.1`, a request saying `content-type: application/grpc` keeps the request-body
/// timeout and the default wait for a response head, as any HTTP/1.1 request does: its
/// client's word alone held a pooled connection for ever. To a TLS backend that picks `h2`,
/// the same call may pause its body and wait for its head as long as it likes.
#[tokio::test]
async fn grpc_keeps_its_bounds_to_a_tls_backend_that_picks_http1() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (h1, ca1) = tls_body_reader(&[b"http/1.1"]).await;
        let (h2, ca2) = tls_body_reader(&[b"h2"]).await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            request_body_timeout: Duration::from_millis(300),
            backend_header_timeout: Duration::from_millis(500),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let to = |addr: std::net::SocketAddr, ca: &str| {
            let tls = json!({"caBundle": ca, "serverName": "backend.internal"});
            json!({"backends": [{"url": format!("https://127.0.0.1:{}", addr.port()), "weight": 1, "tls": tls}]})
        };
        let doc = json!({"rules": [rule("/h1", to(h1, &ca1)), rule("/h2", to(h2, &ca2))]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();

        // A body that stops after its first bytes: cut at the body timeout over HTTP/1.1, with
        // gRPC's DEADLINE_EXCEEDED; over HTTP/2 it may go on after a pause three times as long.
        let call = |path: &str| {
            format!("POST {path} HTTP/1.1\r\nhost: h\r\ncontent-type: application/grpc\r\ncontent-length: 11\r\n\r\nfirst")
        };
        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(call("/h1/pkg.Svc/Call").as_bytes()).await.expect("write");
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        let cut = tokio::time::timeout(Duration::from_secs(5), async {
            while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(cut.is_ok(), "a stalled gRPC body to an HTTP/1.1 backend is cut off: {answer:?}");
        assert!(answer.contains("grpc-status: 4"), "{answer:?}");
        assert!(answer.contains("grpc-message: the request body stopped arriving"), "{answer:?}");

        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(call("/h2/pkg.Svc/Call").as_bytes()).await.expect("write");
        tokio::time::sleep(Duration::from_millis(900)).await;
        s.write_all(b"second").await.expect("write");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while !String::from_utf8_lossy(&answer).contains("read 11 bytes") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.contains("read 11 bytes"), "{answer:?}");

        // A head a second in coming: past the default wait (500 ms here) over HTTP/1.1; over
        // HTTP/2 a call without a deadline of its own waits for it.
        let slow = |path: &str| {
            Request::post(format!("http://{d}{path}"))
                .header("host", "h")
                .header("content-type", "application/grpc")
                .body(Full::new(Bytes::new()))
                .expect("request")
        };
        let r = send(&http, slow("/h1/slow")).await;
        assert_eq!(r.header("grpc-status"), Some("4"), "{:?}", r.body);
        let r = send(&http, slow("/h2/slow")).await;
        assert_eq!((r.status, r.header("grpc-status")), (StatusCode::OK, None));
        assert_eq!(&r.body[..], b"read 0 bytes");
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn in_flight_gauge_rises_and_falls_with_concurrent_requests() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let http = client();
        let proxy = proxy_to(&http, a.http_addr()).await;
        let d = proxy.data_addr();
        let admin = proxy.admin_addr();
        let gauge = "cftunnel_proxy_requests_in_flight";
        assert_eq!(metric(&http, admin, gauge).await, Some(0.0));
        let slow: Vec<_> = (0..20)
            .map(|_| {
                let http = http.clone();
                tokio::spawn(async move { get(&http, d, "h", "/slow?delay=3s", &[]).await.status })
            })
            .collect();
        // The requests take 3 s, so all twenty are in flight together well within 2 s.
        let mut peak = 0.0;
        for _ in 0..100 {
            peak = metric(&http, admin, gauge).await.unwrap_or(0.0);
            if peak >= 20.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(peak, 20.0, "every slow request is counted");
        for s in slow {
            assert_eq!(s.await.expect("task"), StatusCode::OK);
        }
        assert_eq!(
            metric(&http, admin, gauge).await,
            Some(0.0),
            "and uncounted when done"
        );
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn abusive_clients_get_4xx_and_slow_ones_are_cut_off() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            limits: cftunnel_proxy::serve::Limits {
                header_read_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            auth_token: Some(TOKEN.into()),
            ..Default::default()
        })
        .await;
        let http = client();
        push(
            &http,
            proxy.admin_addr(),
            &json!({"rules": [{"backends": [{"url": url(a.http_addr()), "weight": 1}]}]}),
        )
        .await;
        let d = proxy.data_addr();

        let garbage = raw(d, b"THIS IS NOT HTTP\r\n\r\n").await;
        assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
        let mut many = String::from("GET / HTTP/1.1\r\nhost: h\r\n");
        for i in 0..150 {
            many.push_str(&format!("x-h{i}: v\r\n"));
        }
        many.push_str("\r\n");
        let r = raw(d, many.as_bytes()).await;
        assert!(r.starts_with("HTTP/1.1 431"), "too many headers: {r:?}");
        let huge = format!(
            "GET / HTTP/1.1\r\nhost: h\r\nx-big: {}\r\n\r\n",
            "a".repeat(100 * 1024)
        );
        let r = raw(d, huge.as_bytes()).await;
        assert!(
            r.starts_with("HTTP/1.1 431"),
            "oversized head: {:?}",
            r.get(..40)
        );

        // Slowloris: a head that never completes is dropped after the header-read timeout.
        let mut s = tokio::net::TcpStream::connect(d).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: h\r\n")
            .await
            .expect("write");
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the connection is closed by the proxy");
        assert!(started.elapsed() < Duration::from_secs(3));

        // The proxy still serves.
        assert_eq!(get(&http, d, "h", "/", &[]).await.status, StatusCode::OK);
    })
    .await
    .expect("test finished in time");
}

/// A backend's hop-by-hop response headers stop at the proxy, as the tunnel connector stops
/// them: the fixed ones, the legacy ones and those its `Connection` lists.
#[tokio::test]
async fn a_backends_hop_by_hop_headers_do_not_reach_the_client() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = scripted_backend(|mut s| async move {
            let mut buf = Vec::new();
            while next_request_head(&mut s, &mut buf).await {
                let answer = "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\n\
                              keep-alive: timeout=5\r\nproxy-authenticate: Basic realm=\"backend\"\r\n\
                              x-hop: 1\r\nx-kept: k\r\ncontent-length: 2\r\n\r\nok";
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        })
        .await;
        let http = client();
        let proxy = proxy_to(&http, backend).await;
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        for name in ["proxy-authenticate", "keep-alive", "x-hop"] {
            assert_eq!(r.header(name), None, "{name}");
        }
        assert_eq!(r.header("x-kept"), Some("k"));
    })
    .await
    .expect("test finished in time");
}

/// A keep-alive HTTP/1.1 backend that counts the connections it accepts and answers `ok`.
/// With `close_after_each`, it closes every connection silently right after its first
/// response, as a backend whose idle timeout is shorter than the proxy's does.
async fn counting_backend(
    close_after_each: bool,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let addr = scripted_backend(move |mut s| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut buf = Vec::new();
            while next_request_head(&mut s, &mut buf).await {
                let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if s.write_all(reply).await.is_err() || close_after_each {
                    return;
                }
            }
        }
    })
    .await;
    (addr, accepted)
}

/// Reads the next request head of a keep-alive connection into `buf` and drops it from there;
/// false once the connection ends first.
async fn next_request_head(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |p| p + 4);
    buf.drain(..end);
    true
}

#[tokio::test]
async fn backend_connections_are_reused_and_stale_ones_replaced() {
    use std::sync::atomic::Ordering;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let http = client();
        let (keep, kept) = counting_backend(false).await;
        let (drop_each, dropped) = counting_backend(true).await;
        let proxy = proxy().await;
        let doc = json!({"rules": [
            rule("/keep", json!({"backends": [{"url": url(keep), "weight": 1}]})),
            rule("/drop", json!({"backends": [{"url": url(drop_each), "weight": 1}]})),
        ]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();

        for _ in 0..20 {
            let r = get(&http, d, "h", "/keep", &[]).await;
            assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        }
        assert_eq!(
            kept.load(Ordering::SeqCst),
            1,
            "sequential requests share one connection"
        );

        // Ten at once need ten connections; afterwards they are all reused.
        let burst = (0..10).map(|_| get(&http, d, "h", "/keep", &[]));
        for r in futures_util::future::join_all(burst).await {
            assert_eq!(r.status, StatusCode::OK);
        }
        let after_burst = kept.load(Ordering::SeqCst);
        assert!((1..=10).contains(&after_burst), "{after_burst} connections");
        for _ in 0..20 {
            assert_eq!(
                get(&http, d, "h", "/keep", &[]).await.status,
                StatusCode::OK
            );
        }
        assert_eq!(
            kept.load(Ordering::SeqCst),
            after_burst,
            "no new connections once warm"
        );

        // A backend that closes idle connections: every request still succeeds, each on a
        // fresh connection, whether the close was noticed before the next request or not.
        for i in 0..10 {
            let r = get(&http, d, "h", "/drop", &[]).await;
            assert_eq!(r.status, StatusCode::OK, "request {i}");
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 10);
        let errors = metric(
            &http,
            proxy.admin_addr(),
            "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"canceled\"}",
        )
        .await;
        assert_eq!(
            errors.unwrap_or(0.0),
            0.0,
            "no request failed on a stale connection"
        );
    })
    .await
    .expect("test finished in time");
}

/// A backend keeps one client, and so one pool of connections, across pushes: an unchanged rule
/// pushed again, a new rule naming the same backend beside it, and later rules naming it after
/// the first is gone all send their requests over the connection the first request opened.
#[tokio::test]
async fn a_backend_keeps_its_connections_across_pushes_whichever_rules_name_it() {
    use std::sync::atomic::Ordering;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let http = client();
        let (backend, connections) = counting_backend(false).await;
        let proxy = proxy().await;
        let to = |path: &str| {
            rule(
                path,
                json!({"backends": [{"url": url(backend), "weight": 1}]}),
            )
        };
        let pushes: [&[&str]; 5] = [&["/a"], &["/a"], &["/a", "/b"], &["/b"], &["/c", "/b"]];
        for (i, paths) in pushes.iter().enumerate() {
            let doc = json!({"rules": paths.iter().map(|p| to(p)).collect::<Vec<_>>()});
            assert_eq!(
                push(&http, proxy.admin_addr(), &doc).await.status,
                StatusCode::OK,
                "push {i}"
            );
            for path in paths.iter() {
                let r = get(&http, proxy.data_addr(), "h", path, &[]).await;
                assert_eq!(
                    (r.status, &r.body[..]),
                    (StatusCode::OK, &b"ok"[..]),
                    "push {i}, {path}"
                );
            }
            assert_eq!(
                connections.load(Ordering::SeqCst),
                1,
                "push {i}: every request went over the first connection"
            );
        }
    })
    .await
    .expect("test finished in time");
}

/// `timeouts.request` bounds the whole exchange, the response body included (as Envoy's route
/// timeout does): a backend that sends its head at once and then stalls its body has the body
/// cut off at the deadline, instead of holding the client for as long as it likes.
#[tokio::test]
async fn the_request_timeout_also_bounds_the_response_body() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = scripted_backend(|mut conn| async move {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc").await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = conn.write_all(b"defghij").await;
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [
            rule("/bounded", json!({"timeouts": {"request": "400ms"}, "backends": [{"url": url(backend), "weight": 1}]})),
            rule("/", json!({"backends": [{"url": url(backend), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();
        let started = std::time::Instant::now();
        let req = Request::get(format!("http://{d}/bounded")).header("host", "h").body(Full::new(Bytes::new())).expect("req");
        let resp = http.request(req).await.expect("the head arrives");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(resp.into_body()).await;
        assert!(body.is_err(), "the stalled body is cut off");
        assert!(started.elapsed() < Duration::from_millis(2500), "cut at the deadline: {:?}", started.elapsed());
        // Without a request timeout the same body arrives whole.
        let r = get(&http, d, "h", "/open", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"abcdefghij"[..]));
    })
    .await
    .expect("test finished in time");
}

/// `timeouts.backend` is Gateway API's `backendRequest`, which runs "to when the full response
/// has been received from the backend": a body still trickling in at the answering try's
/// deadline is cut off, while a body that ends in time, and one under the proxy's default
/// header timeout (which bounds the head only), arrive whole.
#[tokio::test]
async fn the_backend_timeout_also_bounds_the_response_body() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = scripted_backend(|mut conn| async move {
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            // `/…/quick` trickles 5 bytes over 250 ms, anything else 30 over 3 s.
            let (len, gap) = if buf[..n].windows(6).any(|w| w == b"/quick") {
                (5, Duration::from_millis(50))
            } else {
                (30, Duration::from_millis(100))
            };
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..len {
                tokio::time::sleep(gap).await;
                if conn.write_all(b"x").await.is_err() {
                    return;
                }
            }
        })
        .await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_header_timeout: Duration::from_millis(500),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [
            rule("/bounded", json!({"timeouts": {"backend": "300ms"}, "backends": [{"url": url(backend), "weight": 1}]})),
            rule("/within", json!({"timeouts": {"backend": "2s"}, "backends": [{"url": url(backend), "weight": 1}]})),
            rule("/", json!({"backends": [{"url": url(backend), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let started = std::time::Instant::now();
        let req = Request::get(format!("http://{d}/bounded")).header("host", "h").body(Full::new(Bytes::new())).expect("req");
        let resp = http.request(req).await.expect("the head arrives at once");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(resp.into_body()).await;
        assert!(body.is_err(), "the trickling body is cut off");
        assert!(started.elapsed() < Duration::from_millis(2500), "cut at the deadline: {:?}", started.elapsed());
        let timeouts = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"timeout\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), timeouts).await, Some(1.0), "counted as a backend timeout");

        // A body that ends within the backend timeout is untouched.
        let r = get(&http, d, "h", "/within/quick", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"xxxxx"[..]));
        // The default header timeout (500 ms here) bounds the head only: a 3 s body arrives whole.
        let r = get(&http, d, "h", "/open", &[]).await;
        assert_eq!((r.status, r.body.len()), (StatusCode::OK, 30));
        assert_eq!(metric(&http, proxy.admin_addr(), timeouts).await, Some(1.0));
    })
    .await
    .expect("test finished in time");
}

/// The proxy's default wait for a response head (500 ms here) never cuts a request shorter
/// than its rule allows: a rule's request timeout stretches it, a `0s` timeout (Gateway API:
/// disabled) turns it off, and a gRPC call to an HTTP/2 backend, whose first message may be
/// long in coming, is bounded by its own deadline instead.
#[tokio::test]
async fn the_default_head_timeout_yields_to_the_rules_timeouts_and_to_grpc() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let a = echo("svc-a-1").await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_header_timeout: Duration::from_millis(500),
            ..cftunnel_proxy::ServerOptions::default()
        })
        .await;
        let http = client();
        let to = |extra: serde_json::Value| {
            let mut r = json!({"backends": [{"url": url(a.http_addr()), "weight": 1}]});
            if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
                r.extend(extra.clone());
            }
            r
        };
        let doc = json!({"rules": [
            rule("/default", to(json!({}))),
            rule("/long-request", to(json!({"timeouts": {"request": "5s"}}))),
            rule("/backend-off", to(json!({"timeouts": {"backend": "0s"}}))),
            rule("/request-off", to(json!({"timeouts": {"request": "0s"}}))),
            rule("/h2c", json!({"backends": [{"url": url(a.h2c_addr()), "protocol": "h2c", "weight": 1}]})),
        ]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();
        assert_eq!(
            get(&http, d, "h", "/default?delay=1s", &[]).await.status,
            StatusCode::GATEWAY_TIMEOUT
        );
        for path in ["/long-request", "/backend-off", "/request-off"] {
            let r = get(&http, d, "h", &format!("{path}?delay=1s"), &[]).await;
            assert_eq!(r.status, StatusCode::OK, "{path}");
        }
        // A gRPC call to an HTTP/2 backend: bounded by its own deadline, if it sets one.
        let grpc = |path: &str, deadline: Option<&str>| {
            let mut req = Request::post(format!("http://{d}{path}?delay=1s"))
                .header("host", "h")
                .header("content-type", "application/grpc");
            if let Some(deadline) = deadline {
                req = req.header("grpc-timeout", deadline);
            }
            req.body(Full::new(Bytes::new())).expect("request")
        };
        // The proxy's own gRPC answers carry the code in `grpc-status` (4: DEADLINE_EXCEEDED);
        // the echo backend's sets none.
        let code = |req| async { send(&http, req).await.header("grpc-status").map(str::to_owned) };
        assert_eq!(code(grpc("/h2c", None)).await, None, "no deadline");
        assert_eq!(code(grpc("/h2c", Some("3S"))).await, None, "a later one");
        let earlier = code(grpc("/h2c", Some("200m"))).await;
        assert_eq!(earlier.as_deref(), Some("4"), "an earlier one");
        // Saying gRPC to an HTTP/1.1 backend lifts no bound.
        let h1 = code(grpc("/default", None)).await;
        assert_eq!(h1.as_deref(), Some("4"));
    })
    .await
    .expect("test finished in time");
}

/// A keep-alive HTTP/1.1 backend that holds every request until the test releases it (one
/// permit of `release` each) and counts the connections it accepted and the requests it got.
struct HoldingBackend {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    release: std::sync::Arc<tokio::sync::Semaphore>,
}

impl HoldingBackend {
    async fn start() -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (accepted, received) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let (a, r, rel) = (accepted.clone(), received.clone(), release.clone());
        let addr = scripted_backend(move |mut s| {
            a.fetch_add(1, Ordering::SeqCst);
            let (r, rel) = (r.clone(), rel.clone());
            async move {
                let mut buf = Vec::new();
                while next_request_head(&mut s, &mut buf).await {
                    r.fetch_add(1, Ordering::SeqCst);
                    match rel.acquire().await {
                        Ok(permit) => permit.forget(),
                        Err(_) => return,
                    }
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        })
        .await;
        Self {
            addr,
            accepted,
            received,
            release,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits up to `within` for the backend to have received `want` requests; returns how many.
    async fn received(&self, want: usize, within: Duration) -> usize {
        let until = std::time::Instant::now() + within;
        let count = || self.received.load(std::sync::atomic::Ordering::SeqCst);
        while count() < want && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        count()
    }
}

/// A proxy that opens at most `max` connections to each backend.
async fn limited_proxy(max: usize) -> cftunnel_proxy::Server {
    proxy_with(cftunnel_proxy::ServerOptions {
        auth_token: Some(TOKEN.into()),
        backend_max_connections: max,
        ..cftunnel_proxy::ServerOptions::default()
    })
    .await
}

/// `n` concurrent `GET /` with host `h`, each on its own task.
fn spawn_gets(
    http: &TestClient,
    data: std::net::SocketAddr,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    (0..n)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move { get(&http, data, "h", "/", &[]).await })
        })
        .collect()
}

/// `PROXY_BACKEND_MAX_CONNECTIONS` bounds the connections open to one backend: a request that
/// finds them all busy does not open another but waits for one to come back to the pool.
#[tokio::test]
async fn a_backend_at_its_connection_limit_gets_no_more_and_requests_wait_for_one() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = HoldingBackend::start().await;
        let proxy = limited_proxy(2).await;
        let http = client();
        let doc = json!({"rules": [rule("/", json!({"backends": [{"url": url(backend.addr), "weight": 1}]}))]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let requests = spawn_gets(&http, d, 3);
        assert_eq!(backend.received(2, Duration::from_secs(10)).await, 2, "two requests reach the backend");
        // Given time to open a third connection, the proxy does not.
        assert_eq!(backend.received(3, Duration::from_millis(500)).await, 2, "the third request waits");
        assert_eq!(backend.accepted(), 2, "no third connection");

        // One answer frees its connection, and the waiting request goes out on it.
        backend.release.add_permits(1);
        assert_eq!(backend.received(3, Duration::from_secs(10)).await, 3, "the third request is sent");
        backend.release.add_permits(2);
        for request in requests {
            let r = request.await.expect("request task");
            assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        }
        assert_eq!(backend.accepted(), 2, "all three went over two connections");
    })
    .await
    .expect("test finished in time");
}

/// A push whose pusher hangs up mid-compile (a pusher's own timeout) is still applied to its
/// end, and leaves the proxy's settings as they were: the next push waits for it and keeps
/// `PROXY_BACKEND_MAX_CONNECTIONS`.
#[tokio::test]
async fn a_push_abandoned_mid_compile_keeps_the_proxys_settings() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = HoldingBackend::start().await;
        let proxy = limited_proxy(1).await;
        let http = client();
        let admin = proxy.admin_addr();

        // A document large enough that its compile is still running when the pusher leaves.
        let rules: Vec<_> = (0..10_000)
            .map(|i| {
                json!({"hostnames": [format!("h{i}.example.com")],
                       "matches": [{"path": {"type": "PathPrefix", "value": format!("/p{i}")}}],
                       "backends": [{"url": format!("http://10.0.{}.{}:80", i / 250, i % 250), "weight": 1}]})
            })
            .collect();
        let body = json!({"rules": rules}).to_string();
        let mut pusher = tokio::net::TcpStream::connect(admin).await.expect("connect");
        let head = format!(
            "PUT /config HTTP/1.1\r\nhost: admin\r\nauthorization: Bearer {TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        pusher.write_all(head.as_bytes()).await.expect("write head");
        pusher.write_all(body.as_bytes()).await.expect("write body");
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(pusher);

        let doc = json!({"rules": [rule("/", json!({"backends": [{"url": url(backend.addr), "weight": 1}]}))]});
        assert_eq!(push(&http, admin, &doc).await.status, StatusCode::OK);
        let success = "cftunnel_proxy_config_reloads_total{result=\"success\"}";
        assert_eq!(metric(&http, admin, success).await, Some(2.0), "both pushes applied");

        let d = proxy.data_addr();
        let requests = spawn_gets(&http, d, 2);
        assert_eq!(backend.received(1, Duration::from_secs(10)).await, 1);
        assert_eq!(backend.received(2, Duration::from_millis(500)).await, 1, "the second request waits");
        assert_eq!(backend.accepted(), 1, "the connection limit still holds");
        backend.release.add_permits(2);
        for request in requests {
            let r = request.await.expect("request task");
            assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        }
    })
    .await
    .expect("test finished in time");
}

/// A request that waits out its backend timeout at the connection limit gets 503 (the backend is
/// there, but busy), counted as a backend timeout; the backend never sees it.
#[tokio::test]
async fn a_request_that_finds_no_connection_free_in_time_gets_503() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = HoldingBackend::start().await;
        let proxy = limited_proxy(1).await;
        let http = client();
        let doc = json!({"rules": [
            rule("/held", json!({"timeouts": {"backend": "30s"}, "backends": [{"url": url(backend.addr), "weight": 1}]})),
            rule("/waits", json!({"timeouts": {"backend": "300ms"}, "backends": [{"url": url(backend.addr), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        let held = tokio::spawn({
            let http = http.clone();
            async move { get(&http, d, "h", "/held", &[]).await }
        });
        assert_eq!(backend.received(1, Duration::from_secs(10)).await, 1);
        let r = get(&http, d, "h", "/waits", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::SERVICE_UNAVAILABLE, &b"upstream connection limit reached\n"[..]));
        assert_eq!(backend.received(2, Duration::ZERO).await, 1, "the backend never saw it");
        assert_eq!(backend.accepted(), 1);
        let timeouts = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"timeout\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), timeouts).await, Some(1.0));

        // The held request was never disturbed.
        backend.release.add_permits(1);
        let r = held.await.expect("request task");
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
    })
    .await
    .expect("test finished in time");
}

/// The backend timeout cuts a body that never waits: a backend streaming faster than the
/// client reads has data ready every time the proxy looks, and the body still ends at the
/// answering try's deadline.
#[tokio::test]
async fn the_backend_timeout_cuts_a_body_that_is_always_ready() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // An h2c backend answering with an endless body, as fast as flow control lets it:
        // the proxy's side of the stream always has data buffered for a slow client.
        let backend = scripted_backend(|conn| {
            let service = hyper::service::service_fn(|_req| async {
                let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
                let endless = futures_util::stream::repeat_with(move || {
                    Ok::<_, std::convert::Infallible>(http_body::Frame::data(chunk.clone()))
                });
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::StreamBody::new(endless)))
            });
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        })
        .await;
        let http = client();
        let proxy = proxy().await;
        let doc = json!({"rules": [
            rule("/", json!({"timeouts": {"backend": "300ms"}, "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);

        let mut s = tokio::net::TcpStream::connect(proxy.data_addr()).await.expect("connect");
        s.write_all(b"GET /download HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n").await.expect("request");
        // A client slower than the backend: small reads with pauses.
        let read_all = async {
            let mut buf = [0u8; 4096];
            let mut total = 0usize;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let read = tokio::time::timeout(Duration::from_secs(15), read_all).await;
        assert!(read.is_ok(), "the body is cut off at the backend timeout");
        let timeouts = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"timeout\"}";
        assert_eq!(metric(&http, proxy.admin_addr(), timeouts).await, Some(1.0), "counted as a backend timeout");
    })
    .await
    .expect("test finished in time");
}

/// A proxy whose one rule sends to an endless h2c gRPC stream under a request timeout of
/// `timeout`, and a client of its config port.
async fn before_an_endless_grpc_stream(timeout: &str) -> (cftunnel_proxy::Server, TestClient) {
    let backend = endless_grpc_backend().await;
    let http = client();
    let proxy = proxy().await;
    let doc = json!({"rules": [
        rule("/", json!({"timeouts": {"request": timeout}, "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]})),
    ]});
    assert_eq!(
        push(&http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    (proxy, http)
}

/// A gRPC call over HTTP/2 still streaming at its rule's deadline ends with trailers saying
/// DEADLINE_EXCEEDED (`grpc-status: 4`), as the proxy's own timeouts before the answer do,
/// rather than with its stream reset (which gRPC clients report as INTERNAL).
#[tokio::test]
async fn a_grpc_stream_cut_at_its_deadline_ends_with_deadline_exceeded() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (proxy, http) = before_an_endless_grpc_stream("300ms").await;

        let (trailers, messages) = watch_to_the_end(proxy.data_addr(), "h").await;
        assert!(messages > 0, "messages came before the deadline");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..])
        );
        let timeouts = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"timeout\"}";
        assert_eq!(
            metric(&http, proxy.admin_addr(), timeouts).await,
            Some(1.0),
            "counted as a backend timeout"
        );
    })
    .await
    .expect("test finished in time");
}

/// A gRPC-Web call still streaming at its rule's deadline is cut (its stream reset), not ended
/// cleanly with HTTP trailers: its clients read the status from a frame of the body, never from
/// trailers, and a clean end would pass a cut answer off as whole.
#[tokio::test]
async fn a_grpc_web_stream_cut_at_its_deadline_shows_as_cut() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (proxy, _) = before_an_endless_grpc_stream("300ms").await;

        let (mut sender, _task) = cftunnel_testkit::client::connect_h2c(proxy.data_addr())
            .await
            .expect("connect");
        let req = http::Request::post("http://h/pkg.Svc/Watch")
            .header("content-type", "application/grpc-web+proto")
            .header("te", "trailers")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(&[
                0, 0, 0, 0, 0,
            ])))
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut messages = 0;
        let end = loop {
            match http_body_util::BodyExt::frame(&mut body).await {
                Some(Ok(frame)) if frame.is_trailers() => {
                    break format!("trailers {:?}", frame.into_trailers().ok())
                }
                Some(Ok(_)) => messages += 1,
                Some(Err(e)) => break format!("cut: {e}"),
                None => break "a clean end".to_owned(),
            }
        };
        assert!(messages > 0, "messages came before the deadline");
        assert!(end.starts_with("cut"), "{end}");
    })
    .await
    .expect("test finished in time");
}

/// A `publicOnly` backend is dialled only at public addresses: one on loopback, named by
/// address or by name, is refused with 502 (reason `dial`) before any connection is opened,
/// while the same backend without the flag is reached.
#[tokio::test]
async fn public_only_backends_refuse_addresses_that_are_not_public() {
    use std::sync::atomic::Ordering;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let http = client();
        let (addr, accepted) = counting_backend(false).await;
        let proxy = proxy().await;
        let by_name = format!("http://localhost:{}", addr.port());
        let doc = json!({"rules": [
            rule("/ip", json!({"backends": [{"url": url(addr), "weight": 1, "publicOnly": true}]})),
            rule("/name", json!({"backends": [{"url": by_name, "weight": 1, "publicOnly": true}]})),
            rule("/any", json!({"backends": [{"url": url(addr), "weight": 1}]})),
        ]});
        let admin = proxy.admin_addr();
        assert_eq!(push(&http, admin, &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();
        assert_eq!(
            get(&http, d, "h", "/ip", &[]).await.status,
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            get(&http, d, "h", "/name", &[]).await.status,
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "no connection reached the backend"
        );
        let dial = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"dial\"}";
        assert_eq!(metric(&http, admin, dial).await, Some(2.0));
        let r = get(&http, d, "h", "/any", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("test finished in time");
}

/// This machine's own address that the public-address rule holds public (one of a documentation
/// or public range on an interface), the source address of a route out; `None` where every
/// address it has is a reserved one.
fn local_public_addr() -> Option<std::net::IpAddr> {
    // Connecting a UDP socket only picks a route and a source address: nothing is sent.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    cftunnel_config::address::is_public(ip).then_some(ip)
}

/// A `publicOnly` backend at a public address of one of the cluster's own ranges
/// (`PROXY_CLUSTER_CIDRS`) is refused with 502 (reason `dial`) without a connection being
/// opened, while the same backend with no range listed is reached: what tells the refusal from
/// a failed dial is a backend that answers at that address.
#[tokio::test]
async fn public_only_backends_refuse_the_clusters_own_ranges() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(ip) = local_public_addr() else {
        eprintln!(
            "public_only_backends_refuse_the_clusters_own_ranges: skipped, this machine has no \
             address outside the reserved ranges to listen on"
        );
        return;
    };
    tokio::time::timeout(TEST_TIMEOUT, async {
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind on the machine's own address");
        let backend = listener.local_addr().expect("addr");
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while next_request_head(&mut s, &mut buf).await {
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let doc = json!({"rules": [
            rule("/", json!({"backends": [{"url": url(backend), "weight": 1, "publicOnly": true}]})),
        ]});
        let http = client();

        // Unlisted, the address is public and dialled.
        let open = proxy().await;
        assert_eq!(push(&http, open.admin_addr(), &doc).await.status, StatusCode::OK);
        let r = get(&http, open.data_addr(), "h", "/", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        // Listed (with an IPv6 range beside it), it is the cluster's own and never dialled.
        let ranges = format!("2600:1f14::/32, {ip}/{}", if ip.is_ipv4() { 32 } else { 128 });
        let BinaryProxy { child, data, admin, dir } = BinaryProxy::start(
            "cluster-ranges",
            &doc,
            &[("PROXY_CLUSTER_CIDRS", ranges.as_str())],
        )
        .await;
        let r = get(&http, data, "h", "/", &[]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{ranges}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "no connection reached the backend");
        let dial = "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"dial\"}";
        assert_eq!(metric(&http, admin, dial).await, Some(1.0));
        drop(child);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("test finished in time");
}

/// A `publicOnly` mirror is sent copies only at public addresses: one on loopback gets no
/// connection while the client still gets the primary backend's answer; the same mirror
/// without the flag gets the copy.
#[tokio::test]
async fn public_only_mirrors_send_no_copy_to_addresses_that_are_not_public() {
    use std::sync::atomic::Ordering;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let http = client();
        let (primary, _) = counting_backend(false).await;
        let (checked, checked_accepted) = counting_backend(false).await;
        let (open, open_accepted) = counting_backend(false).await;
        let proxy = proxy().await;
        let mirror = |addr, public_only| {
            json!([{"type": "RequestMirror",
                "requestMirror": {"backendUrl": url(addr), "publicOnly": public_only}}])
        };
        let doc = json!({"rules": [
            rule("/checked", json!({"filters": mirror(checked, true),
                "backends": [{"url": url(primary), "weight": 1}]})),
            rule("/open", json!({"filters": mirror(open, false),
                "backends": [{"url": url(primary), "weight": 1}]})),
        ]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();
        let r = get(&http, d, "h", "/checked", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        let r = get(&http, d, "h", "/open", &[]).await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
        // The second copy goes out after the first: once it has arrived, and a little
        // longer, the first would have too.
        for _ in 0..100 {
            if open_accepted.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            open_accepted.load(Ordering::SeqCst),
            1,
            "the mirror without the flag got the copy"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            checked_accepted.load(Ordering::SeqCst),
            0,
            "no connection reached the checked mirror"
        );
    })
    .await
    .expect("test finished in time");
}

/// A mirror dialled over TLS checks the mirror's certificate as a backend's would (its CA and
/// server name) and gets its copies; one whose name does not match gets none.
#[tokio::test]
async fn a_tls_mirror_gets_its_copies_over_verified_tls() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (mirror, ca, mut seen) = tls_backend().await;
        let a = echo("svc-a-1").await;
        let proxy = proxy().await;
        let http = client();
        let https = format!("https://127.0.0.1:{}", mirror.port());
        let mirrored = |name: &str| {
            json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": https,
                "tls": {"caBundle": ca, "serverName": name}}}],
                "backends": [{"url": url(a.http_addr()), "weight": 1}]})
        };
        let doc = json!({"rules": [
            rule("/impostor", mirrored("impostor.internal")),
            rule("/copied", mirrored("backend.internal")),
        ]});
        let r = push(&http, proxy.admin_addr(), &doc).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        let d = proxy.data_addr();
        assert_eq!(
            get(&http, d, "h", "/impostor", &[]).await.status,
            StatusCode::OK
        );
        assert_eq!(
            get(&http, d, "h", "/copied", &[]).await.status,
            StatusCode::OK
        );
        let path = tokio::time::timeout(Duration::from_secs(5), seen.recv())
            .await
            .expect("a copy")
            .expect("the mirror runs");
        assert_eq!(
            path, "/copied",
            "only the mirror whose name matches is sent a copy"
        );
    })
    .await
    .expect("test finished in time");
}

/// Mirror copies not sent because the body was streamed are counted per copy, as each
/// mirror's share would have taken it: two mirrors of every request and one of one in a
/// million count two a request.
#[tokio::test]
async fn copies_not_sent_for_a_streamed_body_are_counted_per_mirror_and_share() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (a, m) = (echo("svc-a-1").await, echo("mirror-1").await);
        let proxy = proxy().await;
        let http = client();
        let mirror = |extra: serde_json::Value| {
            let mut spec = json!({"backendUrl": url(m.http_addr())});
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
                spec.extend(extra.clone());
            }
            json!({"type": "RequestMirror", "requestMirror": spec})
        };
        let doc = json!({"rules": [
            rule("/upload", json!({"filters": [
                mirror(json!({})),
                mirror(json!({"percent": 100})),
                mirror(json!({"fraction": {"numerator": 1, "denominator": 1_000_000}})),
            ], "backends": [{"url": url(a.http_addr()), "weight": 1}]})),
        ]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, 200);
        // Over the 64 KiB a copy may hold: streamed to the backend, copied nowhere.
        let body = Bytes::from(vec![b'x'; 100 * 1024]);
        for _ in 0..4 {
            let req = Request::post(format!("http://{}/upload", proxy.data_addr()))
                .header("host", "h")
                .body(http_body_util::Full::new(body.clone()))
                .expect("request");
            assert_eq!(send(&http, req).await.status, StatusCode::OK);
        }
        assert_eq!(
            metric(
                &http,
                proxy.admin_addr(),
                "cftunnel_proxy_mirror_requests_dropped_total"
            )
            .await,
            Some(8.0)
        );
    })
    .await
    .expect("test finished in time");
}

/// Clients that stop reading large answers from an h2c backend do not stall the answers other
/// clients get from it over the same multiplexed connection: each stream may run ahead of its
/// reader only by its own window, and the connection's window is far larger than a few of them.
#[tokio::test]
async fn clients_that_stop_reading_do_not_stall_other_answers_from_an_http2_backend() {
    use http_body_util::BodyExt as _;
    const ANSWER: usize = 32 << 20;
    tokio::time::timeout(TEST_TIMEOUT, async {
        // An h2c backend answering every request with 32 MiB in 64 KiB chunks.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let backend = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|_req| async {
                    let chunks = futures_util::stream::iter(
                        (0..ANSWER / 0x10000).map(|_| {
                            Ok::<_, std::convert::Infallible>(http_body::Frame::data(
                                Bytes::from(vec![b'x'; 0x10000]),
                            ))
                        }),
                    );
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::StreamBody::new(chunks),
                    ))
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                );
            }
        });
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        // Eight clients ask and read nothing.
        let mut stalled = Vec::new();
        for _ in 0..8 {
            let mut conn = tokio::net::TcpStream::connect(d).await.expect("connect");
            conn.write_all(b"GET /big HTTP/1.1\r\nhost: h\r\n\r\n").await.expect("sent");
            stalled.push(conn);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;

        // Another gets its whole answer.
        let (mut sender, _task) = cftunnel_testkit::client::connect_http1(d).await.expect("connect");
        let req = http::Request::get("/big")
            .header("host", "h")
            .body(http_body_util::Full::new(Bytes::new()))
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
            .await
            .expect("the answer is not stalled by the clients that stopped reading")
            .expect("body")
            .to_bytes();
        assert_eq!(body.len(), ANSWER);
        drop(stalled);
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 backend's stream limit does not hold requests up while long-lived streams fill
/// it: past a share of streams per connection, requests go on another connection to the
/// backend, as Go's Transport opens one.
#[tokio::test]
async fn long_lived_streams_do_not_hold_other_requests_to_an_http2_backend_at_its_stream_limit() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    tokio::time::timeout(TEST_TIMEOUT, async {
        // An h2c backend allowing 128 streams a connection, as nginx does: `/hold` is never
        // answered, anything else at once.
        let held = std::sync::Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let backend = listener.local_addr().expect("addr");
        let counter = held.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let counter = counter.clone();
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let counter = counter.clone();
                    async move {
                        if req.uri().path() == "/hold" {
                            counter.fetch_add(1, Ordering::SeqCst);
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"quick"))))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .max_concurrent_streams(128)
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                );
            }
        });
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(push(&http, proxy.admin_addr(), &doc).await.status, StatusCode::OK);
        let d = proxy.data_addr();

        // 130 requests that stay open, more than the backend takes on one connection.
        let (sender, _task) = cftunnel_testkit::client::connect_h2c(d).await.expect("connect");
        let mut open = Vec::new();
        for _ in 0..130 {
            let mut sender = sender.clone();
            open.push(tokio::spawn(async move {
                let req = Request::get("/hold").header("host", "h").body(Full::new(Bytes::new())).expect("request");
                sender.send_request(req).await
            }));
        }
        let by = std::time::Instant::now() + Duration::from_secs(10);
        while held.load(Ordering::SeqCst) < 130 {
            assert!(std::time::Instant::now() < by, "only {} of the 130 reached the backend", held.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = tokio::time::timeout(Duration::from_secs(10), get(&http, d, "h", "/quick", &[]))
            .await
            .expect("another request is answered");
        assert_eq!(r.status, StatusCode::OK);
        for request in open {
            request.abort();
        }
    })
    .await
    .expect("test finished in time");
}

/// A body of stated length trickling in holds no backend connection: it is read whole before
/// the request takes one. With a single connection to the backend, other requests are served
/// meanwhile, and the upload goes out complete once its last byte is in.
#[tokio::test]
async fn a_body_trickling_in_holds_no_backend_connection_meanwhile() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, accepted) = body_echoing_backend().await;
        let proxy = limited_proxy(1).await;
        let http = client();
        let doc = json!({"rules": [rule("/", json!({
            "timeouts": {"backend": "2s"},
            "backends": [{"url": url(backend), "weight": 1}]
        }))]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();

        let mut upload = tokio::net::TcpStream::connect(d).await.expect("connect");
        upload
            .write_all(b"POST /upload HTTP/1.1\r\nhost: h\r\ncontent-length: 10\r\n\r\nabc")
            .await
            .expect("head and the first bytes written");
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..3 {
            let r = get(&http, d, "h", "/other", &[]).await;
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        }

        upload
            .write_all(b"defghij")
            .await
            .expect("the rest written");
        let answer = read_until_ending(&mut upload, b"abcdefghij").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one connection served both"
        );
    })
    .await
    .expect("test finished in time");
}
