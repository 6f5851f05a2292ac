//! End to end: how the proxy holds its connections to HTTP/2 backends (h2c here; a TLS backend
//! that picks `h2` is held the same way): what it pings, how many streams it opens on one, how
//! large an answer's headers may be.

use crate::support;

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::h2_tap::H2Tap;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Frames = StreamBody<
    futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>,
>;

/// An h2c backend on 127.0.0.1 allowing `streams` streams a connection, answering each
/// request with `answer`.
async fn h2c_backend<F, Fut>(streams: u32, answer: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Frames>> + Send + 'static,
{
    scripted_backend(move |conn| {
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |req| {
            let answer = answer.clone();
            async move { Ok::<_, Infallible>(answer(req).await) }
        });
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .max_concurrent_streams(streams)
            .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
    })
    .await
}

fn body(frames: Vec<http_body::Frame<Bytes>>, then_wait: bool) -> Frames {
    use futures_util::StreamExt as _;
    let frames = futures_util::stream::iter(frames.into_iter().map(Ok));
    let stream = if then_wait {
        frames.chain(futures_util::stream::pending()).boxed()
    } else {
        frames.boxed()
    };
    StreamBody::new(stream)
}

async fn route_to(proxy: &cftunnel_proxy::Server, http: &TestClient, backend: SocketAddr) {
    let doc =
        json!({"rules": [{"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
    assert_eq!(
        push(http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
}

fn request(path: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", "h")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// gRPC servers (grpc-go, grpc-java, C-core) close a connection, and every stream on it, once
/// a client pings it more than twice in a row sooner than 5 minutes apart, or while no stream
/// is open. A connection to an HTTP/2 backend is pinged only while a request on it is quiet,
/// no sooner than the keep-alive interval after it last read anything, and not at all once
/// nothing is in flight. The interval is shortened here so that a few seconds show each
/// case; by default it is 10 minutes.
#[tokio::test]
async fn http2_backends_are_pinged_only_while_requests_are_quiet_and_never_while_idle() {
    const INTERVAL: Duration = Duration::from_secs(1);
    tokio::time::timeout(TEST_TIMEOUT, async {
        // `/hold` is answered with a head and then nothing: a watch with nothing to report.
        let backend = h2c_backend(100, |req: Request<Incoming>| async move {
            let hold = req.uri().path() == "/hold";
            Response::new(body(
                vec![http_body::Frame::data(Bytes::from_static(b"."))],
                hold,
            ))
        })
        .await;
        let tap = H2Tap::spawn(backend).await.expect("relay");
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_keep_alive: cftunnel_proxy::forward::KeepAlive {
                interval: INTERVAL,
                timeout: Duration::from_secs(10),
            },
            ..Default::default()
        })
        .await;
        let http = client();
        route_to(&proxy, &http, tap.addr()).await;
        let d = proxy.data_addr();

        // A quiet request: pinged, as a connection that may have died, but never sooner than
        // the interval after the last ping.
        let (mut sender, conn) = cftunnel_testkit::client::connect_http1(d)
            .await
            .expect("connect");
        let resp = sender.send_request(request("/hold")).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        tokio::time::sleep(INTERVAL * 7 / 2).await;
        let pings = tap.pings();
        assert!(
            pings.len() >= 2,
            "a connection with a quiet request is pinged: {} pings",
            pings.len()
        );
        for pair in pings.windows(2) {
            let apart = pair[1] - pair[0];
            assert!(
                apart >= INTERVAL - Duration::from_millis(50),
                "pings {apart:?} apart"
            );
        }

        // Nothing in flight: no pings, however long the connection stays open.
        drop(resp);
        drop(sender);
        conn.abort();
        tokio::time::sleep(INTERVAL / 2).await;
        let before = tap.pings().len();
        tokio::time::sleep(INTERVAL * 7 / 2).await;
        assert_eq!(
            tap.pings().len(),
            before,
            "an idle connection is not pinged"
        );

        // And it is still open: the next request takes it rather than a new one.
        let dialed = || {
            tap.frames()
                .iter()
                .filter(|f| f.kind == 0x4 && f.flags & 0x1 == 0)
                .count()
        };
        let before = dialed();
        assert_eq!(
            get(&http, d, "h", "/quick", &[]).await.status,
            StatusCode::OK
        );
        assert_eq!(dialed(), before, "no new connection was dialed");
    })
    .await
    .expect("test finished in time");
}

/// A backend that allows fewer streams a connection than the proxy would open (a gRPC server
/// given `MaxConcurrentStreams(20)`) has requests past its limit sent on another connection:
/// on the same one they would wait for as long as the long-lived streams stay open.
#[tokio::test]
async fn requests_past_an_http2_backends_own_stream_limit_go_to_another_connection() {
    const LIMIT: usize = 20;
    tokio::time::timeout(TEST_TIMEOUT, async {
        // `/hold` is never answered, anything else at once.
        let held = Arc::new(AtomicUsize::new(0));
        let counter = held.clone();
        let backend = h2c_backend(LIMIT as u32, move |req: Request<Incoming>| {
            let counter = counter.clone();
            async move {
                if req.uri().path() == "/hold" {
                    counter.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
                Response::new(body(
                    vec![http_body::Frame::data(Bytes::from_static(b"quick"))],
                    false,
                ))
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        route_to(&proxy, &http, backend).await;
        let d = proxy.data_addr();

        // As many requests as the backend takes on one connection, held open.
        let (sender, _task) = cftunnel_testkit::client::connect_h2c(d)
            .await
            .expect("connect");
        let mut open = Vec::new();
        for _ in 0..LIMIT {
            let mut sender = sender.clone();
            open.push(tokio::spawn(async move {
                sender.send_request(request("/hold")).await
            }));
        }
        let by = Instant::now() + Duration::from_secs(10);
        while held.load(Ordering::SeqCst) < LIMIT {
            assert!(
                Instant::now() < by,
                "only {} of {LIMIT} reached the backend",
                held.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // One more: answered.
        let r = tokio::time::timeout(Duration::from_secs(10), get(&http, d, "h", "/quick", &[]))
            .await
            .expect("a request past the backend's stream limit is answered");
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, Bytes::from_static(b"quick"));
        for request in open {
            request.abort();
        }
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 backend may answer with as large a head, and trailers, as a client may send the
/// proxy (64 KiB by default), as gRPC metadata and `grpc-status-details-bin` can be: relayed
/// intact rather than refused.
#[tokio::test]
async fn large_headers_and_trailers_from_an_http2_backend_are_relayed_intact() {
    const HEADERS: usize = 4;
    const HEADER: usize = 10 * 1024;
    const DETAILS: usize = 24 * 1024;
    let value = |c: &str, n: usize| c.repeat(n);
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = h2c_backend(100, move |_req: Request<Incoming>| async move {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            trailers.insert(
                "grpc-status-details-bin",
                value("d", DETAILS).parse().expect("value"),
            );
            let mut resp = Response::new(body(
                vec![
                    http_body::Frame::data(Bytes::from_static(b"ok")),
                    http_body::Frame::trailers(trailers),
                ],
                false,
            ));
            for i in 0..HEADERS {
                resp.headers_mut().insert(
                    http::HeaderName::try_from(format!("x-meta-{i}")).expect("name"),
                    value("m", HEADER).parse().expect("value"),
                );
            }
            resp
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        route_to(&proxy, &http, backend).await;

        // A client that takes large headers, over h2c so that trailers reach it.
        let tcp = tokio::net::TcpStream::connect(proxy.data_addr())
            .await
            .expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .max_header_list_size(1 << 20)
                .handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let resp = sender
            .send_request(
                Request::get("http://h/large")
                    .body(Full::new(Bytes::new()))
                    .expect("request"),
            )
            .await
            .expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        for i in 0..HEADERS {
            assert_eq!(
                resp.headers().get(format!("x-meta-{i}")).map(|v| v.len()),
                Some(HEADER),
                "x-meta-{i}"
            );
        }
        let collected = resp.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"ok"));
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        assert_eq!(
            trailers.get("grpc-status-details-bin").map(|v| v.len()),
            Some(DETAILS)
        );
    })
    .await
    .expect("test finished in time");
}

/// A backend that stops answering without closing its connection (a node gone without a
/// reset, a partition) is found by the requests sent to it: one that waited the keep-alive
/// timeout for its answer, with nothing answered on the connection meanwhile, takes the
/// connection out of use, and the next request goes out on a new one. Pings alone would find
/// it only after their interval (10 minutes).
#[tokio::test]
async fn a_connection_on_which_nothing_is_answered_takes_no_more_requests() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        // `/hang` is never answered; anything else at once.
        let backend = h2c_backend(100, |req: Request<Incoming>| async move {
            if req.uri().path() == "/hang" {
                std::future::pending::<()>().await;
            }
            Response::new(body(
                vec![http_body::Frame::data(Bytes::from_static(b"ok"))],
                false,
            ))
        })
        .await;
        // Counts the connections the proxy opens to the backend.
        let relay_addr = scripted_backend(move |mut client| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            }
        })
        .await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_keep_alive: cftunnel_proxy::forward::KeepAlive {
                interval: Duration::from_secs(600),
                timeout: Duration::from_millis(500),
            },
            ..Default::default()
        })
        .await;
        let http = client();
        let doc = json!({"rules": [{"timeouts": {"backend": "1s"},
            "backends": [{"url": url(relay_addr), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let d = proxy.data_addr();
        assert_eq!(
            send(&http, request(&format!("http://{d}/ok"))).await.status,
            StatusCode::OK
        );
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        // Answered quickly: a request that does not wait long marks nothing.
        assert_eq!(
            send(&http, request(&format!("http://{d}/ok"))).await.status,
            StatusCode::OK
        );
        assert_eq!(
            connections.load(Ordering::SeqCst),
            1,
            "the connection is reused"
        );
        let r = send(&http, request(&format!("http://{d}/hang"))).await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", r.body);
        assert_eq!(
            send(&http, request(&format!("http://{d}/ok"))).await.status,
            StatusCode::OK
        );
        assert_eq!(
            connections.load(Ordering::SeqCst),
            2,
            "the request after the silent one went out on a new connection"
        );
    })
    .await
    .expect("test finished in time");
}

/// A backend that allows one stream a connection, and streams it holds open: with
/// `PROXY_BACKEND_MAX_CONNECTIONS` at 2, the proxy opens two connections and no more. A
/// request past them waits for a share, as one past an HTTP/1.1 backend's limit waits for a
/// connection: it is answered 503 (`upstream connection limit reached`) when none comes free
/// within its bound, and served as soon as one does. Without the limit every such request
/// dialed a connection of its own, which stayed open.
#[tokio::test]
async fn http2_connections_to_a_backend_stay_within_the_connection_limit() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // `/hold` is answered with a head and then nothing; anything else at once.
        let backend = h2c_backend(1, |req: Request<Incoming>| async move {
            let hold = req.uri().path() == "/hold";
            Response::new(body(
                vec![http_body::Frame::data(Bytes::from_static(b"ok"))],
                hold,
            ))
        })
        .await;
        // Counts the connections the proxy opens to the backend.
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        let relay = scripted_backend(move |mut client| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            }
        })
        .await;
        let proxy = proxy_with(cftunnel_proxy::ServerOptions {
            auth_token: Some(TOKEN.into()),
            backend_max_connections: 2,
            backend_header_timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .await;
        let http = client();
        route_to(&proxy, &http, relay).await;
        let d = proxy.data_addr();
        let quick = || send(&http, request(&format!("http://{d}/quick")));

        // Answered: the backend's SETTINGS (one stream a connection) have come.
        assert_eq!(quick().await.status, StatusCode::OK);
        assert_eq!(connections.load(Ordering::SeqCst), 1);

        // Two streams held open, one on each connection the limit allows.
        let (sender, _task) = cftunnel_testkit::client::connect_h2c::<Full<Bytes>>(d)
            .await
            .expect("connect");
        let mut held = Vec::new();
        for _ in 0..2 {
            let resp = sender
                .clone()
                .send_request(request(&format!("http://{d}/hold")))
                .await
                .expect("a head");
            assert_eq!(resp.status(), StatusCode::OK);
            held.push(resp);
        }
        assert_eq!(connections.load(Ordering::SeqCst), 2);

        // Past the limit: no share comes free within the bound (1 s here).
        let r = quick().await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
        assert_eq!(&r.body[..], b"upstream connection limit reached\n");
        assert_eq!(
            connections.load(Ordering::SeqCst),
            2,
            "no dial past the limit"
        );

        // One does: the request waiting for it is served on it.
        let waiting = tokio::spawn({
            let http = http.clone();
            async move { send(&http, request(&format!("http://{d}/quick"))).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(held.pop());
        let r = waiting.await.expect("task");
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    })
    .await
    .expect("test finished in time");
}

/// Plays an h2c backend's side of the HTTP/2 handshake on `conn`: reads the client's preface
/// and SETTINGS, sends its own SETTINGS (defaults) and acknowledges the client's.
async fn raw_h2_handshake(conn: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut preface = [0; 24];
    conn.read_exact(&mut preface).await?;
    let (kind, _, _, _) = read_frame(conn).await?;
    assert_eq!(kind, 0x4, "the client's first frame is SETTINGS");
    // SETTINGS (empty), then SETTINGS with ACK.
    conn.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await?;
    conn.write_all(&[0, 0, 0, 0x4, 0x1, 0, 0, 0, 0]).await
}

/// One HTTP/2 frame read off `conn`: its type, flags, stream id and payload.
async fn read_frame(conn: &mut tokio::net::TcpStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0; 9];
    conn.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    conn.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

/// Reads frames off `conn` until the first HEADERS, and returns its stream id.
async fn read_until_headers(conn: &mut tokio::net::TcpStream) -> std::io::Result<u32> {
    loop {
        let (kind, _, stream, _) = read_frame(conn).await?;
        if kind == 0x1 {
            return Ok(stream);
        }
    }
}

/// A GOAWAY frame: the last stream the backend processes, and no error.
fn go_away(last_stream: u32) -> Vec<u8> {
    let mut frame = vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0];
    frame.extend_from_slice(&last_stream.to_be_bytes());
    frame.extend_from_slice(&0u32.to_be_bytes());
    frame
}

/// What an h2c backend served: each request's method, path and whole body.
type Seen = Arc<std::sync::Mutex<Vec<(http::Method, String, Bytes)>>>;

/// Serves `conn` as an h2c backend that reads each request's body whole, records it in `seen`
/// and answers `200 ok`.
async fn serve_and_record(conn: tokio::net::TcpStream, seen: Seen) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let seen = seen.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            seen.lock()
                .expect("lock")
                .push((parts.method, parts.uri.path().to_owned(), body));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
        .await;
}

fn post(d: SocketAddr, path: &str, body: &'static [u8]) -> Request<Full<Bytes>> {
    Request::post(format!("http://{d}{path}"))
        .header("host", "h")
        .body(Full::new(Bytes::from_static(body)))
        .expect("request")
}

/// A proxy routing everything to the h2c `backend`, with no bound on the wait for an answer
/// but the client's, and a client.
async fn patient_proxy_to(backend: SocketAddr) -> (cftunnel_proxy::Server, TestClient) {
    let proxy = proxy_with(cftunnel_proxy::ServerOptions {
        auth_token: Some(TOKEN.into()),
        backend_header_timeout: Duration::from_secs(600),
        ..Default::default()
    })
    .await;
    let http = client();
    route_to(&proxy, &http, backend).await;
    (proxy, http)
}

/// A backend that completes the HTTP/2 handshake and then goes silent, without closing (a node
/// gone without a reset, a partition): once a request there is given up (here its client, at
/// 6 s) after 5 s with nothing at all read, the connection takes no more, and the next request
/// goes out on a new connection and is answered.
#[tokio::test]
async fn a_connection_gone_silent_takes_no_more_once_a_request_there_is_given_up() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        let seen = Seen::default();
        let recorded = seen.clone();
        let backend = scripted_backend(move |mut conn| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let seen = recorded.clone();
            async move {
                if n > 0 {
                    return serve_and_record(conn, seen).await;
                }
                // The first connection: a handshake, then silence, the socket left open.
                if raw_h2_handshake(&mut conn).await.is_ok() {
                    std::future::pending::<()>().await;
                }
            }
        })
        .await;
        let (proxy, http) = patient_proxy_to(backend).await;
        let d = proxy.data_addr();

        let started = Instant::now();
        let hanging = tokio::spawn({
            let http = http.clone();
            let request = http.request(request(&format!("http://{d}/hang")));
            async move { tokio::time::timeout(Duration::from_secs(6), request).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        assert!(!hanging.is_finished(), "the first request waits");
        assert!(
            hanging.await.expect("task").is_err(),
            "its client gives up at 6 s"
        );

        // Found within a tick (a second) of the request given up: a new connection.
        tokio::time::sleep_until((started + Duration::from_secs(7)).into()).await;
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            send(&http, request(&format!("http://{d}/next"))),
        )
        .await
        .expect("the next request is not sent on the silent connection");
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 2, "one new connection");
        assert_eq!(seen.lock().expect("lock").len(), 1);
    })
    .await
    .expect("test finished in time");
}

/// A backend that answers one request only after 10 s, saying nothing meanwhile (a gRPC watch
/// that sends its head with its first message, a long poll), keeps its connection: requests
/// sent while that one waits share it, and it is answered.
#[tokio::test]
async fn a_request_answered_late_keeps_its_connection_in_use() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        let backend = scripted_backend(move |conn| {
            counted.fetch_add(1, Ordering::SeqCst);
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                if req.uri().path() == "/late" {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
            async move {
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                        .await;
            }
        })
        .await;
        let (proxy, http) = patient_proxy_to(backend).await;
        let d = proxy.data_addr();

        let started = Instant::now();
        let late = tokio::spawn({
            let http = http.clone();
            async move { send(&http, request(&format!("http://{d}/late"))).await }
        });
        // Well past 5 s of quiet on the connection, another request goes out on it.
        tokio::time::sleep_until((started + Duration::from_secs(8)).into()).await;
        let r = send(&http, request(&format!("http://{d}/quick"))).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 1, "the same connection");
        let r = late.await.expect("task");
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    })
    .await
    .expect("test finished in time");
}

/// An h2c backend (the `h2` crate's server) that resets with `REFUSED_STREAM` each stream
/// `refuse` picks by its number (from 0, across connections), and reads the others' bodies
/// whole, records them and answers `200 ok`; with the count of streams it was sent.
async fn refusing_backend(refuse: fn(usize) -> bool) -> (SocketAddr, Arc<AtomicUsize>, Seen) {
    let streams = Arc::new(AtomicUsize::new(0));
    let seen = Seen::default();
    let (counted, recorded) = (streams.clone(), seen.clone());
    let addr = scripted_backend(move |conn| {
        let (streams, seen) = (counted.clone(), recorded.clone());
        async move {
            let Ok(mut conn) = h2::server::handshake(conn).await else {
                return;
            };
            while let Some(Ok((req, mut respond))) = conn.accept().await {
                if refuse(streams.fetch_add(1, Ordering::SeqCst)) {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    continue;
                }
                let seen = seen.clone();
                tokio::spawn(async move {
                    let (parts, mut body) = req.into_parts();
                    let mut data = Vec::new();
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        data.extend_from_slice(&chunk);
                    }
                    seen.lock().expect("lock").push((
                        parts.method,
                        parts.uri.path().to_owned(),
                        Bytes::from(data),
                    ));
                    if let Ok(mut send) = respond.send_response(Response::new(()), false) {
                        let _ = send.send_data(Bytes::from_static(b"ok"), true);
                    }
                });
            }
        }
    })
    .await;
    (addr, streams, seen)
}

/// An HTTP/2 backend that resets a stream with `REFUSED_STREAM` (as one does with a stream
/// past its limit, opened before its SETTINGS arrived) did not process it (RFC 9113 §8.7):
/// the request is sent again, whatever its method, with its body whole.
#[tokio::test]
async fn requests_on_streams_an_http2_backend_refused_are_sent_again() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Every other stream (the first, the third...) is refused.
        let (backend, streams, seen) = refusing_backend(|n| n % 2 == 0).await;
        let proxy = proxy().await;
        let http = client();
        route_to(&proxy, &http, backend).await;
        let d = proxy.data_addr();

        let r = send(&http, post(d, "/post", b"a small body")).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(r.body, Bytes::from_static(b"ok"));
        let r = send(&http, request(&format!("http://{d}/get"))).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

        assert_eq!(
            streams.load(Ordering::SeqCst),
            4,
            "each sent twice, no more"
        );
        assert_eq!(
            seen.lock().expect("lock").clone(),
            [
                (
                    http::Method::POST,
                    "/post".to_owned(),
                    Bytes::from_static(b"a small body")
                ),
                (http::Method::GET, "/get".to_owned(), Bytes::new()),
            ]
        );
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 backend whose GOAWAY leaves a stream out (its last stream id below the stream's:
/// a server shutting down as the request arrived) did not process it: the request is sent
/// again on a new connection, whatever its method. One the GOAWAY covers may have been
/// processed: when the connection then closes under it, it is not sent again.
#[tokio::test]
async fn requests_an_http2_backends_goaway_left_out_are_sent_again_and_no_others() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // The first connection sends GOAWAY once the first request's HEADERS come, with the
        // last stream id the test sets, then closes; later ones serve and record.
        let last_stream = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Seen::default();
        let (counted, recorded, last) = (connections.clone(), seen.clone(), last_stream.clone());
        let backend = scripted_backend(move |mut conn| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let (seen, last) = (recorded.clone(), last.clone());
            async move {
                use tokio::io::AsyncWriteExt;
                if n > 0 {
                    return serve_and_record(conn, seen).await;
                }
                if raw_h2_handshake(&mut conn).await.is_err() {
                    return;
                }
                if read_until_headers(&mut conn).await.is_err() {
                    return;
                }
                let last = last.load(Ordering::SeqCst) as u32;
                let _ = conn.write_all(&go_away(last)).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        let proxy = proxy().await;
        let http = client();
        route_to(&proxy, &http, backend).await;
        let d = proxy.data_addr();

        // Last stream 0: the request's stream (1) is left out, and sent again.
        let r = send(&http, post(d, "/post", b"a small body")).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 2);
        assert_eq!(
            seen.lock().expect("lock").clone(),
            [(
                http::Method::POST,
                "/post".to_owned(),
                Bytes::from_static(b"a small body")
            )]
        );

        // Last stream 1, the request's: the connection closes under it, and it is not sent
        // again. A new proxy, so that its first connection is the backend's "first" again.
        connections.store(0, Ordering::SeqCst);
        last_stream.store(1, Ordering::SeqCst);
        seen.lock().expect("lock").clear();
        let second = support::proxy().await;
        route_to(&second, &http, backend).await;
        let r = send(&http, post(second.data_addr(), "/post", b"a small body")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
        assert_eq!(connections.load(Ordering::SeqCst), 1, "not sent again");
        assert!(seen.lock().expect("lock").is_empty());
    })
    .await
    .expect("test finished in time");
}

/// Sending a refused request again is part of its try, once: under a retry policy, a backend
/// that refuses every stream is sent each try twice, and the policy's attempts (and budget)
/// count tries as before.
#[tokio::test]
async fn a_refused_request_is_sent_again_once_per_try_under_a_retry_policy() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (backend, streams, seen) = refusing_backend(|_| true).await;
        let proxy = proxy().await;
        let http = client();
        let doc = json!({"rules": [{"retry": {"codes": [503], "attempts": 1, "backoff": "1ms"},
            "backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let r = send(&http, post(proxy.data_addr(), "/post", b"a small body")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
        assert_eq!(
            streams.load(Ordering::SeqCst),
            4,
            "two tries (one retry), each sent twice"
        );
        assert!(seen.lock().expect("lock").is_empty());
    })
    .await
    .expect("test finished in time");
}
