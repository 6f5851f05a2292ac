//! End to end: messages the proxy must not pass on as they came, on real sockets. A backend's
//! response that is not valid HTTP (502, never retried), transfer codings other than
//! `chunked` either way, an HTTP/1.0 backend's version, the proxy's own answers to gRPC-Web
//! calls, and gRPC trailers to a client over HTTP/1.1.

use crate::support::*;
use bytes::Bytes;
use http::StatusCode;
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The status code of a raw answer (`HTTP/1.1 502 Bad Gateway...`).
fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

/// The value of header `name` in a raw answer's head.
fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A backend that answers every request head with `answer`, then holds the connection until
/// the proxy closes it; counts the request heads it read.
async fn answering(answer: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
    let heads = Arc::new(AtomicUsize::new(0));
    let counted = heads.clone();
    let answer: Arc<[u8]> = answer.into();
    let addr = scripted_backend(move |mut conn: tokio::net::TcpStream| {
        let (counted, answer) = (counted.clone(), answer.clone());
        async move {
            if request_head(&mut conn).await.is_none() {
                return;
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = conn.write_all(&answer).await;
            let mut buf = [0u8; 1024];
            while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
        }
    })
    .await;
    (addr, heads)
}

/// A proxy with one host-less rule to `backend`, whose rule adds `extra` (a retry policy).
async fn proxy_with_rule(
    backend: SocketAddr,
    extra: serde_json::Value,
) -> (cftunnel_proxy::Server, TestClient) {
    let proxy = proxy().await;
    let http = client();
    let mut rule = json!({"backends": [{"url": url(backend), "weight": 1}]});
    if let (Some(rule), Some(extra)) = (rule.as_object_mut(), extra.as_object()) {
        rule.extend(extra.clone());
    }
    let doc = json!({"rules": [rule]});
    assert_eq!(
        push(&http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    (proxy, http)
}

/// A backend answering with a head hyper cannot read (conflicting lengths, an obsolete line
/// folding, a head past the client's bound) has sent an invalid response (RFC 9110 §15.6.3):
/// the client gets 502 saying so, counted as reason `other`; it is not a reset connection
/// (503), and it is not tried again, since the backend has seen the request and may have acted
/// on it.
#[tokio::test]
async fn an_unreadable_backend_response_is_answered_502_and_not_retried() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let oversized = format!(
            "HTTP/1.1 200 OK\r\nx-big: {}\r\nContent-Length: 2\r\n\r\nok",
            "b".repeat(512 * 1024)
        );
        let answers: [(&str, Vec<u8>); 3] = [
            (
                "conflicting lengths",
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc".to_vec(),
            ),
            (
                "obsolete line folding",
                b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            ),
            ("oversized head", oversized.into_bytes()),
        ];
        for (case, answer) in answers {
            let (backend, heads) = answering(answer).await;
            let (proxy, http) =
                proxy_with_rule(backend, json!({"retry": {"attempts": 1, "backoff": "1ms"}})).await;
            let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
            // The answer, and how many requests the backend got: one, not retried.
            assert_eq!(
                (
                    r.status,
                    String::from_utf8_lossy(&r.body),
                    heads.load(Ordering::SeqCst)
                ),
                (
                    StatusCode::BAD_GATEWAY,
                    "upstream sent an invalid response\n".into(),
                    1
                ),
                "{case}"
            );
            assert_eq!(
                metric(
                    &http,
                    proxy.admin_addr(),
                    "cftunnel_proxy_backend_errors_total{hostname=\"*\",reason=\"other\"}"
                )
                .await,
                Some(1.0),
                "{case}"
            );
        }
    })
    .await
    .expect("test finished in time");
}

/// The same over HTTP/2: a response head h2 refuses as malformed (conflicting
/// `content-length`s, RFC 9113 §8.1.1) is an invalid response, answered 502 and not sent
/// again.
#[tokio::test]
async fn a_malformed_http2_response_head_is_answered_502_and_not_retried() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let streams = Arc::new(AtomicUsize::new(0));
        let counted = streams.clone();
        let backend = scripted_backend(move |tcp: tokio::net::TcpStream| {
            let counted = counted.clone();
            async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let mut resp = http::Response::new(());
                    resp.headers_mut()
                        .append("content-length", http::HeaderValue::from_static("1"));
                    resp.headers_mut()
                        .append("content-length", http::HeaderValue::from_static("2"));
                    if let Ok(mut body) = respond.send_response(resp, false) {
                        let _ = body.send_data(Bytes::from_static(b"x"), true);
                    }
                }
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"retry": {"attempts": 1, "backoff": "1ms"},
            "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = get(&http, proxy.data_addr(), "h", "/", &[]).await;
        // The answer, and how many streams the backend saw: one, not sent again.
        assert_eq!(
            (
                r.status,
                String::from_utf8_lossy(&r.body),
                streams.load(Ordering::SeqCst)
            ),
            (
                StatusCode::BAD_GATEWAY,
                "upstream sent an invalid response\n".into(),
                1
            )
        );
    })
    .await
    .expect("test finished in time");
}

/// A request body coded other than by `chunked` alone (`gzip, chunked`, which hyper frames by
/// its chunks) is answered 501, as Go's server does, and nothing reaches the backend, which
/// would read the gzip bytes as the body; `chunked` alone, in any case, goes through.
#[tokio::test]
async fn a_request_transfer_coding_other_than_chunked_is_answered_501() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, heads) =
            answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
        let (proxy, _http) = proxy_with_rule(backend, json!({})).await;
        let answer = raw(
            proxy.data_addr(),
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\
              Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "501", "{answer}");
        assert_eq!(heads.load(Ordering::SeqCst), 0, "the backend saw nothing");

        let answer = raw(
            proxy.data_addr(),
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\
              Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "200", "{answer}");
        assert_eq!(heads.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("test finished in time");
}

/// A backend's response coded other than by `chunked` alone is an invalid response: relayed,
/// its coding would be stripped with its framing and the coded bytes reach the client as the
/// body.
#[tokio::test]
async fn a_response_transfer_coding_other_than_chunked_is_answered_502() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, heads) = answering(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        )
        .await;
        let (proxy, _http) = proxy_with_rule(backend, json!({})).await;
        let answer = raw(
            proxy.data_addr(),
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "502", "{answer}");
        assert!(
            answer.ends_with("upstream sent an invalid response\n"),
            "{answer}"
        );
        assert_eq!(heads.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("test finished in time");
}

/// Reads one answer with a `content-length` from `conn`: its head, and its body as text.
async fn read_answer(conn: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 1024];
        let n = conn.read(&mut chunk).await.expect("the answer comes");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .expect("a content-length");
    while buf.len() < end + length {
        let mut chunk = [0u8; 1024];
        let n = conn.read(&mut chunk).await.expect("the body comes");
        assert!(n > 0, "body cut off");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[end..end + length]).into_owned();
    buf.drain(..end + length);
    (head, body)
}

/// An HTTP/1.0 backend's answer reaches an HTTP/1.1 client in HTTP/1.1 (RFC 9110 §6.2), and
/// the client's connection stays open for its next request.
#[tokio::test]
async fn an_http10_backend_is_answered_to_an_http11_client_in_http11() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = scripted_backend(|mut conn: tokio::net::TcpStream| async move {
            if request_head(&mut conn).await.is_some() {
                let _ = conn
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            }
        })
        .await;
        let (proxy, _http) = proxy_with_rule(backend, json!({})).await;
        let mut conn = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        let mut buf = Vec::new();
        for i in 0..2 {
            conn.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
                .await
                .expect("write");
            let (head, body) = read_answer(&mut conn, &mut buf).await;
            assert!(head.starts_with("HTTP/1.1 200 "), "request {i}: {head}");
            assert_eq!(body, "ok", "request {i}");
        }
    })
    .await
    .expect("test finished in time");
}

/// The proxy's own answer to a gRPC-Web call is of the call's content type family, with its
/// message format, or a gRPC-Web client refuses it before reading `grpc-status`; and
/// `grpc-message` is percent-encoded, as gRPC requires of it.
#[tokio::test]
async fn grpc_web_calls_get_grpc_web_answers_with_an_encoded_message() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"hostnames": ["app.example.com"], "backends": []}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let answer = raw(
            proxy.data_addr(),
            b"POST /pkg.Svc/Call HTTP/1.1\r\nHost: elsewhere.example.com\r\n\
              content-type: application/grpc-web+proto\r\ncontent-length: 0\r\n\
              Connection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status(&answer), "200", "{answer}");
        assert_eq!(
            header(&answer, "content-type"),
            Some("application/grpc-web+proto"),
            "{answer}"
        );
        assert_eq!(header(&answer, "grpc-status"), Some("12"), "{answer}");

        // A path that cannot be read: a message that holds a `%`.
        let answer = raw(
            proxy.data_addr(),
            b"POST /pkg.Svc/Call%zz HTTP/1.1\r\nHost: app.example.com\r\n\
              content-type: application/grpc-web-text\r\ncontent-length: 0\r\n\
              Connection: close\r\n\r\n",
        )
        .await;
        assert_eq!(
            header(&answer, "content-type"),
            Some("application/grpc-web-text"),
            "{answer}"
        );
        assert_eq!(header(&answer, "grpc-status"), Some("3"), "{answer}");
        assert_eq!(
            header(&answer, "grpc-message"),
            Some("the request path has a `%25` not followed by two hex digits"),
            "{answer}"
        );
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/1.1 client that takes trailers (`TE: trailers`) gets the `grpc-status` trailer of an
/// HTTP/2 gRPC backend that does not announce it: the proxy announces gRPC's trailers, which
/// an HTTP/1.1 encoder needs before it writes any.
#[tokio::test]
async fn an_http11_grpc_client_gets_the_unannounced_grpc_status_trailer() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = scripted_backend(|conn| {
            let service = hyper::service::service_fn(|_req| async {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("7"));
                let frames = futures_util::stream::iter([
                    Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(&[
                        0, 0, 0, 0, 0,
                    ]))),
                    Ok(http_body::Frame::trailers(trailers)),
                ]);
                let mut response = http::Response::new(http_body_util::StreamBody::new(frames));
                response.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/grpc"),
                );
                Ok::<_, Infallible>(response)
            });
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let mut conn = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        conn.write_all(
            b"POST /pkg.Svc/Call HTTP/1.1\r\nHost: h\r\ncontent-type: application/grpc\r\n\
              te: trailers\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0",
        )
        .await
        .expect("write");
        // The chunked body's last chunk, then its trailer section up to the empty line.
        let mut answer = Vec::new();
        let trailer_section = loop {
            if let Some(at) = answer.windows(5).position(|w| w == b"\r\n0\r\n") {
                let rest = &answer[at + 5..];
                if rest.starts_with(b"\r\n") || rest.windows(4).any(|w| w == b"\r\n\r\n") {
                    break String::from_utf8_lossy(rest).into_owned();
                }
            }
            let mut chunk = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk))
                .await
                .expect("the answer comes")
                .expect("read");
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&chunk[..n]);
        };
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert!(
            text.to_ascii_lowercase().contains("\r\ntransfer-encoding: chunked\r\n"),
            "{text}"
        );
        assert!(
            trailer_section.contains("grpc-status: 7\r\n"),
            "the answer ends with grpc-status: {text:?}"
        );
    })
    .await
    .expect("test finished in time");
}
