//! Reused backend connections that the backend closes as a request goes out on them: what a
//! backend's keep-alive timeout (2-5 s in Node, gunicorn, uvicorn) does when it fires just as
//! the proxy reuses the connection.

use crate::support::*;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The requests a backend saw: the connection each came on (counted from 1) and its request
/// line's method and target.
type Seen = Arc<Mutex<Vec<(usize, String)>>>;

/// A keep-alive backend that answers the first request on each connection (`conn N`) and
/// closes the connection when the next one arrives on it, without answering: the backend
/// ended the connection as the request was written.
async fn closing_backend(seen: Seen) -> SocketAddr {
    let conns = Arc::new(AtomicUsize::new(0));
    scripted_backend(move |mut conn: tokio::net::TcpStream| {
        let n = conns.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            for nth in 1.. {
                let end = loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end);
                let line: Vec<&str> = head.split_whitespace().take(2).collect();
                seen.lock().expect("lock").push((n, line.join(" ")));
                if nth > 1 {
                    return;
                }
                let body = format!("conn {n}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if conn.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

async fn call(http: &TestClient, proxy: SocketAddr, method: Method, path: &str) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{proxy}{path}"))
        .header("host", "app.example")
        .body(Full::new(Bytes::new()))
        .expect("request");
    send(http, req).await
}

/// An idempotent request (GET, DELETE) on a reused connection that sat idle and that the
/// backend closes before answering is sent once more, on a new connection, and answered; a
/// POST is not sent again (the backend may have acted on it) and fails with 503, as any reset
/// exchange does.
#[tokio::test]
async fn an_idempotent_request_on_a_reused_connection_the_backend_closed_is_sent_once_more() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let seen = Seen::default();
        let backend = closing_backend(seen.clone()).await;
        let http = client();
        let proxy = proxy_to(&http, backend).await;
        let data = proxy.data_addr();

        // Each reused connection has sat idle, as one a keep-alive timer closes has.
        let idle = || tokio::time::sleep(std::time::Duration::from_millis(600));
        let r = call(&http, data, Method::GET, "/one").await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"conn 1"[..]));
        idle().await;
        let r = call(&http, data, Method::GET, "/two").await;
        assert_eq!(
            (r.status, &r.body[..]),
            (StatusCode::OK, &b"conn 2"[..]),
            "answered on a new connection"
        );
        idle().await;
        let r = call(&http, data, Method::POST, "/three").await;
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "a POST is not sent twice: it fails as the reset it met"
        );
        let r = call(&http, data, Method::DELETE, "/four").await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"conn 3"[..]));
        idle().await;
        let r = call(&http, data, Method::DELETE, "/five").await;
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"conn 4"[..]));

        let seen = seen.lock().expect("lock").clone();
        let want: Vec<(usize, String)> = [
            (1, "GET /one"),
            (1, "GET /two"),
            (2, "GET /two"),
            (2, "POST /three"),
            (3, "DELETE /four"),
            (3, "DELETE /five"),
            (4, "DELETE /five"),
        ]
        .into_iter()
        .map(|(n, l)| (n, l.to_owned()))
        .collect();
        assert_eq!(seen, want);
    })
    .await
    .expect("test finished in time");
}
