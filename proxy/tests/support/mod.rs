//! Shared fixtures for the proxy's end-to-end tests: echo backends, a proxy, an HTTP client.
#![allow(dead_code)]

use bytes::Bytes;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::time::Duration;

pub const TOKEN: &str = "test-token";

/// Every test is bounded by this.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

pub async fn echo(pod: &str) -> EchoServer {
    EchoServer::spawn(
        "127.0.0.1".parse().expect("ip"),
        EchoIdentity {
            namespace: "test".into(),
            pod: pod.into(),
        },
    )
    .await
    .expect("echo backend starts")
}

pub async fn proxy() -> Server {
    proxy_with(ServerOptions {
        auth_token: Some(TOKEN.into()),
        ..ServerOptions::default()
    })
    .await
}

pub async fn proxy_with(options: ServerOptions) -> Server {
    Server::start(options, None).await.expect("proxy starts")
}

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// A runtime of one thread, for a test that drives a client (or a proxy) apart from the
/// runtime it watches.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http()
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The pod of the echo backend that answered.
    pub fn pod(&self) -> String {
        self.json()["pod"].as_str().unwrap_or_default().to_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The values the echo backend saw for a request header, joined with `,`.
    pub fn seen_header(&self, name: &str) -> Option<String> {
        let headers = self.json()["headers"].as_object()?.clone();
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            })
    }
}

pub async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> Reply {
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .expect("response within 20s")
        .expect("request succeeds");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body reads").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// GET `http://addr{target}` with a Host header and extra headers.
pub async fn get(
    client: &TestClient,
    addr: SocketAddr,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = Request::get(format!("http://{addr}{target}")).header("host", host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(client, b.body(Full::new(Bytes::new())).expect("request")).await
}

/// `PUT /config` with the test token.
pub async fn push(client: &TestClient, admin: SocketAddr, doc: &serde_json::Value) -> Reply {
    push_raw(
        client,
        admin,
        Some(TOKEN),
        "application/json",
        doc.to_string().into(),
    )
    .await
}

pub async fn push_raw(
    client: &TestClient,
    admin: SocketAddr,
    token: Option<&str>,
    content_type: &str,
    body: Bytes,
) -> Reply {
    let mut b = Request::put(format!("http://{admin}/config")).header("content-type", content_type);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    send(client, b.body(Full::new(body)).expect("request")).await
}

/// A config with one host-less rule per (path prefix, backend) pair.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// Reads one metric sample (`name{labels}`) from `/metrics`.
pub async fn metric(client: &TestClient, admin: SocketAddr, series: &str) -> Option<f64> {
    let r = get(client, admin, "admin", "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A proxy serving one host-less rule to `backend`.
pub async fn proxy_to(http: &TestClient, backend: SocketAddr) -> Server {
    let proxy = proxy().await;
    let doc = serde_json::json!({"rules": [{"backends": [{"url": url(backend), "weight": 1}]}]});
    assert_eq!(
        push(http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    proxy
}

/// Writes raw bytes on a fresh connection and reads until the peer closes (or 5 s pass).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A port on 127.0.0.1 nothing listens on right now, for a child process to bind; picked
/// below the ephemeral range, where other tests' connections do not take it first.
pub fn free_port() -> u16 {
    cftunnel_testkit::ports::free_port()
        .expect("a free port")
        .port()
}

/// A backend that answers each connection's first request with `answer` as soon as it has
/// read the request's head, without waiting for its body (as a streaming server does), then
/// waits for the client to go.
pub async fn answering_backend(answer: &'static [u8]) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    scripted_backend(move |mut conn: tokio::net::TcpStream| async move {
        if request_head(&mut conn).await.is_none() {
            return;
        }
        let _ = conn.write_all(answer).await;
        let _ = conn.read(&mut [0u8; 64]).await;
    })
    .await
}

/// The head of the next request on `conn` (with whatever body bytes came with it); `None`
/// when the connection ends first.
pub async fn request_head(conn: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// Answers on `conn` with a chunked body that never ends, until a write fails: the proxy let
/// the connection go.
pub async fn stream_without_end(conn: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head).await.is_err() {
        return;
    }
    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
    while conn.write_all(chunk.as_bytes()).await.is_ok() {}
}

/// Reads from `conn` until what came ends with `end`; panics if the connection ends first.
pub async fn read_until_ending(conn: &mut tokio::net::TcpStream, end: &[u8]) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    while !answer.ends_with(end) {
        let mut chunk = [0u8; 1024];
        let n = conn.read(&mut chunk).await.expect("the answer comes");
        assert!(n > 0, "cut off after {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// An h2c gRPC backend answering every call with a stream of messages, one every 20 ms,
/// without end.
pub async fn endless_grpc_backend() -> SocketAddr {
    scripted_backend(|conn| {
        let service = hyper::service::service_fn(|_req| async {
            let message = Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1]);
            let endless = futures_util::stream::unfold(message, |message| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let frame = http_body::Frame::data(message.clone());
                Some((Ok::<_, std::convert::Infallible>(frame), message))
            });
            let mut response = http::Response::new(http_body_util::StreamBody::new(endless));
            response.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok::<_, std::convert::Infallible>(response)
        });
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
    })
    .await
}

/// Calls `/pkg.Svc/Watch` over h2c at `addr` (host `host`) and reads its stream to the end:
/// the trailers it ended with, and how many messages came before; panics if it fails or ends
/// without trailers.
pub async fn watch_to_the_end(addr: SocketAddr, host: &str) -> (http::HeaderMap, usize) {
    let (mut sender, _task) = cftunnel_testkit::client::connect_h2c(addr)
        .await
        .expect("connect");
    let req = Request::post(format!("http://{host}/pkg.Svc/Watch"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut messages = 0;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_trailers() {
                Ok(trailers) => return (trailers, messages),
                Err(_) => messages += 1,
            },
            Some(Err(e)) => panic!("the stream failed after {messages} messages: {e}"),
            None => panic!("the stream ended without trailers after {messages} messages"),
        }
    }
}

/// A backend that answers each request with its body (read by its `content-length`), counting
/// the connections it accepted.
pub async fn body_echoing_backend() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let addr = scripted_backend(move |mut conn: tokio::net::TcpStream| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut buf = Vec::new();
            loop {
                let end = loop {
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    let mut chunk = [0u8; 4096];
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < end + length {
                    let mut chunk = [0u8; 4096];
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = buf[end..end + length].to_vec();
                buf.drain(..end + length);
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n");
                if conn.write_all(answer.as_bytes()).await.is_err()
                    || conn.write_all(&body).await.is_err()
                {
                    return;
                }
            }
        }
    })
    .await;
    (addr, accepted)
}

/// A backend on 127.0.0.1 that hands every connection it accepts to `serve`, each on its own
/// task; returns the address it listens on.
pub async fn scripted_backend<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn));
        }
    });
    addr
}

/// The proxy binary in standalone mode with `doc` as its config file and `env` on top, stdout
/// piped; started once both its listeners are bound and it answers `/readyz` 200.
pub struct BinaryProxy {
    pub child: tokio::process::Child,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    /// The scratch directory of its config file, for the caller to remove.
    pub dir: std::path::PathBuf,
}

impl BinaryProxy {
    pub async fn start(name: &str, doc: &serde_json::Value, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("cftunnel-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join("config.json");
        std::fs::write(&config, doc.to_string()).expect("write config");
        // A port found free may be taken before the proxy binds it (another test's listener,
        // or a client's ephemeral port): a proxy that exits before it is ready is started
        // again on other ports.
        let mut attempts = 0;
        let (child, data, admin) = loop {
            attempts += 1;
            let (data_port, admin_port) = (free_port(), free_port());
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
                .env_remove("TUNNEL_TOKEN")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .env("PROXY_ADDR", format!("127.0.0.1:{data_port}"))
                .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
                .env("PROXY_AUTH_TOKEN", TOKEN)
                .envs(env.iter().copied())
                .arg("--config-file")
                .arg(&config)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("proxy binary starts");
            let data = SocketAddr::from(([127, 0, 0, 1], data_port));
            let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
            let http = client();
            let ready_by = std::time::Instant::now() + Duration::from_secs(20);
            let ready = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    assert!(
                        attempts < 3,
                        "the proxy exited before it was ready: {status}"
                    );
                    break false;
                }
                // Both listeners: ready on one says nothing of the other's bind.
                let up = tokio::net::TcpStream::connect(admin).await.is_ok()
                    && tokio::net::TcpStream::connect(data).await.is_ok();
                if up && get(&http, admin, "a", "/readyz", &[]).await.status == 200 {
                    break true;
                }
                assert!(std::time::Instant::now() < ready_by, "proxy became ready");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if ready {
                break (child, data, admin);
            }
        };
        Self {
            child,
            data,
            admin,
            dir,
        }
    }
}

/// An address that refuses connections: bound but not listening, and held by the returned
/// socket so no other test's listener can land on it meanwhile.
pub fn dead_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections")
}

/// Starts a proxy binary in tunnel mode against `edge`, with `doc` as its config file if
/// given; returns at once with it and its admin address.
pub async fn spawn_tunnel_proxy(
    edge: &cftunnel_testkit::edge::MockEdge,
    dir: &std::path::Path,
    token: &str,
    protocol: &str,
    doc: Option<&serde_json::Value>,
    env: &[(&str, &str)],
) -> (std::process::Child, std::net::SocketAddr) {
    spawn_tunnel_proxy_logging(
        edge,
        dir,
        token,
        protocol,
        doc,
        env,
        std::process::Stdio::null(),
    )
    .await
}

/// [`spawn_tunnel_proxy`] writing its log lines to `stderr`.
pub async fn spawn_tunnel_proxy_logging(
    edge: &cftunnel_testkit::edge::MockEdge,
    dir: &std::path::Path,
    token: &str,
    protocol: &str,
    doc: Option<&serde_json::Value>,
    env: &[(&str, &str)],
    stderr: std::process::Stdio,
) -> (std::process::Child, std::net::SocketAddr) {
    let ca = dir.join("edge-ca.pem");
    edge.write_ca_pem(&ca).await.expect("CA written");
    let admin_port = free_port();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"));
    command
        .env("TUNNEL_TOKEN", token)
        .env("TUNNEL_EDGE", edge.edge_addr().to_string())
        .env("TUNNEL_CACERT", &ca)
        .env("PROXY_TUNNEL_PROTOCOL", protocol)
        .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{admin_port}"))
        .env("PROXY_AUTH_TOKEN", TOKEN)
        // A drain holds the tunnel connections for the whole grace period: kept short here.
        .env("PROXY_GRACE_PERIOD", "2s")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    if let Some(doc) = doc {
        let config = dir.join("config.json");
        std::fs::write(&config, doc.to_string()).expect("write config");
        command.arg("--config-file").arg(&config);
    }
    let child = command.spawn().expect("proxy binary starts");
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
    (child, admin)
}

/// Waits until the proxy whose admin port is `admin` is ready: a tunnel connection of
/// `protocol` is registered.
pub async fn ready_once_registered(admin: SocketAddr, protocol: &str) {
    let http = client();
    let ready_by = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let up = tokio::net::TcpStream::connect(admin).await.is_ok();
        if up && get(&http, admin, "a", "/readyz", &[]).await.status == 200 {
            return;
        }
        assert!(
            std::time::Instant::now() < ready_by,
            "{protocol}: ready once a tunnel connection is registered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A WebSocket session, as the tests' client holds it.
pub type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket at `url` through the proxy (101) and checks that `text` comes back: the
/// session, still open.
pub async fn websocket_echoing(url: &str, text: &str) -> WebSocket {
    use futures_util::{SinkExt as _, StreamExt as _};
    let (mut ws, resp) = tokio_tungstenite::connect_async(url)
        .await
        .expect("websocket handshake through the proxy");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(tokio_tungstenite::tungstenite::Message::text(text))
        .await
        .expect("send");
    let echoed = ws.next().await.expect("a frame").expect("no error");
    assert_eq!(echoed.into_text().expect("text").as_str(), text);
    ws
}

/// Sends `head` (request line and headers, without `content-length`) to `addr` with a body of
/// `size` bytes, written as fast as the proxy takes it and then held open, the client in no
/// hurry to finish; returns the answer's head, and how long it took to come.
pub async fn answer_to_a_held_upload(
    addr: SocketAddr,
    head: &str,
    size: usize,
) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = conn.into_split();
    let head = format!("{head}content-length: {size}\r\n\r\n");
    let upload = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..size / chunk.len() {
            writer.write_all(&chunk).await?;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, std::io::Error>(writer)
    });
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), reader.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            other => panic!("no answer to the held upload: {other:?}"),
        }
    }
    let took = started.elapsed();
    upload.abort();
    (String::from_utf8_lossy(&answer).into_owned(), took)
}
