//! The echo backend over real sockets, driven by real HTTP/1.1, h2c and WebSocket clients.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::client::{connect_h2c, connect_http1};
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const TEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn echo() -> EchoServer {
    EchoServer::spawn(
        LOCALHOST,
        EchoIdentity {
            namespace: "gateway-conformance-infra".into(),
            pod: "infra-backend-v1-abc-123".into(),
        },
    )
    .await
    .expect("echo server binds on 127.0.0.1:0")
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        assert_eq!(self.headers["content-type"], "application/json");
        serde_json::from_slice(&self.body).expect("echo body is JSON")
    }
}

/// One request on a fresh HTTP/1.1 connection.
async fn h1(addr: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    let (mut sender, _conn) = connect_http1(addr).await.expect("h1 connection");
    let resp = sender.send_request(req).await.expect("h1 response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("h1 body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

fn get(addr: SocketAddr, target: &str) -> Request<Full<Bytes>> {
    Request::get(target)
        .header("host", addr.to_string())
        .body(Full::default())
        .expect("valid request")
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test finished within its time bound")
}

#[tokio::test]
async fn echoes_request_fields_as_json() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let req = Request::post("/some/path?b=2&a=%2F")
            .header("host", "example.com:8080")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-multi", "one")
            .header("x-multi", "two")
            .body(Full::new(Bytes::from_static(b"hello")))
            .expect("valid request");
        let reply = h1(addr, req).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.headers["x-content-type-options"], "nosniff");
        let json = reply.json();
        assert_eq!(json["path"], "/some/path?b=2&a=%2F");
        assert_eq!(json["host"], "example.com:8080");
        assert_eq!(json["method"], "POST");
        assert_eq!(json["proto"], "HTTP/1.1");
        assert_eq!(json["namespace"], "gateway-conformance-infra");
        assert_eq!(json["pod"], "infra-backend-v1-abc-123");
        assert_eq!(json["httpPort"], addr.port().to_string());
        assert_eq!(json["ingress"], "");
        assert_eq!(json["service"], "");
        assert_eq!(json["sni"], "");
        assert!(
            reply.body.starts_with(b"{\n \"path\""),
            "indented by one space"
        );
        let headers = &json["headers"];
        assert_eq!(headers["X-Forwarded-For"], serde_json::json!(["10.0.0.1"]));
        assert_eq!(headers["X-Multi"], serde_json::json!(["one", "two"]));
        assert_eq!(headers["Content-Length"], serde_json::json!(["5"]));
        assert!(headers.get("Host").is_none(), "Host is not in headers");
    })
    .await;
}

#[tokio::test]
async fn set_header_requests_become_response_headers() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let req = Request::get("/")
            .header("host", "x")
            .header(
                "x-echo-set-header",
                "X-Header-Set:set,X-Header-Add:a,X-Header-Add:b",
            )
            .body(Full::default())
            .expect("valid request");
        let reply = h1(addr, req).await;
        assert_eq!(reply.headers["x-header-set"], "set");
        assert_eq!(reply.headers["x-header-add"], "a,b");
        // every X-Echo-Set-Header line counts
        let req = Request::get("/")
            .header("host", "x")
            .header("x-echo-set-header", "X-One:1")
            .header("x-echo-set-header", "X-Two:2,X-One:again")
            .body(Full::default())
            .expect("valid request");
        let reply = h1(addr, req).await;
        assert_eq!(reply.headers["x-one"], "1,again");
        assert_eq!(reply.headers["x-two"], "2");
        // an empty X-Echo-Set-Header sets nothing
        let req = Request::get("/")
            .header("host", "x")
            .header("x-echo-set-header", "")
            .body(Full::default())
            .expect("valid request");
        let reply = h1(addr, req).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.headers.get("x-header-set").is_none());
    })
    .await;
}

#[tokio::test]
async fn delay_query_sleeps_before_answering() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let start = tokio::time::Instant::now();
        let reply = h1(addr, get(addr, "/slow?delay=300ms")).await;
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["path"], "/slow?delay=300ms");
        let reply = h1(addr, get(addr, "/slow?delay=soon")).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.json()["message"], "time: invalid duration \"soon\"");
    })
    .await;
}

#[tokio::test]
async fn status_and_health_routes_answer_bare() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let reply = h1(addr, get(addr, "/status/503")).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(reply.body.is_empty());
        assert!(reply.headers.get("content-type").is_none());
        let reply = h1(addr, get(addr, "/status/418")).await;
        assert_eq!(reply.status, StatusCode::IM_A_TEAPOT);
        for malformed in [
            "/status/abc",
            "/status/5030",
            "/status/503?x=1",
            "//status//503",
        ] {
            let reply = h1(addr, get(addr, malformed)).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{malformed}");
        }
        let reply = h1(addr, get(addr, "//health")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], b"OK");
        assert!(server.log_lines().is_empty(), "bare routes are not echoed");
    })
    .await;
}

#[tokio::test]
async fn retry_with_response_code_fails_then_echoes() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let target = "/retry/x?uuid=u-1&succeedAfter=2&responseCode=503&delayRetry=50ms";
        for _ in 0..2 {
            let start = tokio::time::Instant::now();
            let reply = h1(addr, get(addr, target)).await;
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(start.elapsed() >= Duration::from_millis(50));
        }
        let reply = h1(addr, get(addr, target)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["path"], target);
        assert_eq!(server.count_echoed(target), 1);
        // another uuid has its own counter
        let other = "/retry/x?uuid=u-2&succeedAfter=1&responseCode=500";
        assert_eq!(
            h1(addr, get(addr, other)).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(h1(addr, get(addr, other)).await.status, StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn retry_without_response_code_resets_the_connection() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let request = b"GET /retry/?uuid=rst&succeedAfter=1 HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request).await.expect("write request");
        let mut buf = Vec::new();
        let err = stream
            .read_to_end(&mut buf)
            .await
            .expect_err("the server resets the connection");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
        assert!(buf.is_empty(), "no response bytes before the reset");

        let reply = h1(addr, get(addr, "/retry/?uuid=rst&succeedAfter=1")).await;
        assert_eq!(reply.status, StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn retry_without_uuid_or_count_is_a_bad_request() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        for target in [
            "/retry/?succeedAfter=1",
            "/retry/?uuid=a",
            "/retry/?uuid=a&succeedAfter=x",
        ] {
            assert_eq!(
                h1(addr, get(addr, target)).await.status,
                StatusCode::BAD_REQUEST,
                "{target}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn h2c_port_serves_http2_prior_knowledge() {
    bounded(async {
        let server = echo().await;
        let addr = server.h2c_addr();
        let (mut sender, _conn) = connect_h2c(addr).await.expect("h2 connection");
        let req = Request::get(format!("http://h2c.example:{}/h2?x=1", addr.port()))
            .header("x-echo-set-header", "X-From:h2")
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.headers()["x-from"], "h2");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let json: Value = serde_json::from_slice(&body).expect("JSON body");
        assert_eq!(json["proto"], "HTTP/2.0");
        assert_eq!(json["path"], "/h2?x=1");
        assert_eq!(json["host"], format!("h2c.example:{}", addr.port()));
        assert!(json["headers"].get("Host").is_none());
    })
    .await;
}

#[tokio::test]
async fn h2c_port_rejects_http1_with_400() {
    bounded(async {
        let server = echo().await;
        let addr = server.h2c_addr();
        let reply = h1(addr, get(addr, "/")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert_eq!(&reply.body[..], b"Expected h2c request");
        assert!(server.log_lines().is_empty());
    })
    .await;
}

#[tokio::test]
async fn http_port_also_accepts_http2_prior_knowledge() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let (mut sender, _conn) = connect_h2c(addr).await.expect("h2 connection");
        let req = Request::get(format!("http://{addr}/"))
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), StatusCode::OK);
    })
    .await;
}

#[tokio::test]
async fn websocket_echoes_text_and_binary_frames() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), stream)
            .await
            .expect("websocket handshake");
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        ws.send(Message::text("hello")).await.expect("send text");
        assert_eq!(
            ws.next().await.expect("reply").expect("frame"),
            Message::text("hello")
        );
        ws.send(Message::binary(vec![0u8, 1, 2, 255]))
            .await
            .expect("send binary");
        assert_eq!(
            ws.next().await.expect("reply").expect("frame"),
            Message::binary(vec![0u8, 1, 2, 255])
        );
        ws.close(None).await.expect("close");

        // a plain GET on /ws is not a handshake
        assert_eq!(
            h1(addr, get(addr, "/ws")).await.status,
            StatusCode::BAD_REQUEST
        );
    })
    .await;
}

#[tokio::test]
async fn log_lines_record_every_echoed_request() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let stream = TcpStream::connect(addr).await.expect("connect");
        let local = stream.local_addr().expect("local addr");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        for target in ["/mirror?id=1", "/mirror?id=2", "/mirror?id=1"] {
            let resp = sender
                .send_request(get(addr, target))
                .await
                .expect("response");
            resp.into_body().collect().await.expect("body");
        }
        assert_eq!(
            server.log_lines(),
            vec![
                format!("Echoing back request made to /mirror?id=1 to client ({local})"),
                format!("Echoing back request made to /mirror?id=2 to client ({local})"),
                format!("Echoing back request made to /mirror?id=1 to client ({local})"),
            ]
        );
        assert_eq!(server.count_echoed("/mirror?id=1"), 2);
        assert_eq!(server.count_echoed("/mirror?id=2"), 1);
        assert_eq!(server.count_echoed("/mirror"), 0);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_closes_the_listeners() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        server.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err());
    })
    .await;
}

#[tokio::test]
async fn request_bodies_are_read_and_discarded() {
    bounded(async {
        let server = echo().await;
        let addr = server.http_addr();
        let body = Bytes::from(vec![b'x'; 1024 * 1024]);
        let req = Request::put("/upload")
            .header("host", "x")
            .body(Full::new(body))
            .expect("valid request");
        let reply = h1(addr, req).await;
        assert_eq!(reply.status, StatusCode::OK);
        let json = reply.json();
        assert_eq!(json["method"], "PUT");
        assert_eq!(
            json["headers"]["Content-Length"],
            serde_json::json!(["1048576"])
        );
    })
    .await;
}
