//! The mock edge against the real `cloudflared`, over both transports: registration,
//! the configuration a connector gets when it registers and later pushes, requests,
//! uploads, WebSockets, refusals and drain, all through a `cloudflared` process.
//!
//! `cloudflared` is not part of the build, so these tests are ignored by default.
//! Run them with a binary of it:
//!
//! ```sh
//! CLOUDFLARED=/path/to/cloudflared cargo test -p cftunnel-loadtest --test suite cloudflared:: -- --ignored
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use cftunnel_testkit::edge::MockEdge;
use cftunnel_testkit::wait::wait_until;
use cftunnel_tunnel::EdgeRefusal;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

const LIMIT: Duration = Duration::from_secs(60);
const HOST: &str = "app.example.com";
const UNREACHABLE: &str = "unreachable.example.com";

fn cloudflared_bin() -> PathBuf {
    std::env::var_os("CLOUDFLARED")
        .map(PathBuf::from)
        .expect("set CLOUDFLARED to a cloudflared binary to run these tests")
}

/// A tunnel token as the dashboard hands it out (base64 JSON); the mock edge takes any.
fn token() -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let secret: Vec<u8> = (0u8..32).collect();
    let json = serde_json::json!({
        "a": "0123456789abcdef0123456789abcdef",
        "t": uuid::Uuid::new_v4().to_string(),
        "s": b64.encode(secret),
    });
    b64.encode(json.to_string())
}

fn ingress(echo: &EchoServer) -> Vec<u8> {
    serde_json::json!({
        "ingress": [
            {"hostname": HOST, "service": format!("http://{}", echo.http_addr())},
            // Nothing listens on port 1: `cloudflared` cannot reach this origin.
            {"hostname": UNREACHABLE, "service": "http://127.0.0.1:1"},
            {"service": "http_status:404"}
        ],
        "warp-routing": {},
        "originRequest": {}
    })
    .to_string()
    .into_bytes()
}

struct Setup {
    edge: MockEdge,
    echo: EchoServer,
    cloudflared: Child,
    _dir: tempdir::Dir,
}

/// Tiny scratch directory for the CA file, removed on drop.
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p =
                std::env::temp_dir().join(format!("cftunnel-cloudflared-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Starts `cloudflared` against `edge` with `ha` connections (the edge listed `ha` times).
async fn spawn_cloudflared(
    edge: &MockEdge,
    dir: &tempdir::Dir,
    protocol: &str,
    ha: usize,
) -> Child {
    let ca = dir.0.join("ca.pem");
    edge.write_ca_pem(&ca).await.unwrap();
    let mut cmd = Command::new(cloudflared_bin());
    cmd.args([
        "tunnel",
        "--no-autoupdate",
        "--no-prechecks",
        "--loglevel",
        "debug",
    ])
    .args(["--metrics", "127.0.0.1:0", "--grace-period", "10s"])
    .arg("--cacert")
    .arg(&ca);
    for _ in 0..ha {
        cmd.arg("--edge").arg(edge.edge_addr().to_string());
    }
    cmd.args(["--protocol", protocol, "run", "--token", &token()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("CLOUDFLARED_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true);
    cmd.spawn().expect("cloudflared starts")
}

async fn setup(protocol: &str, ha: usize) -> Setup {
    let echo = EchoServer::spawn(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        EchoIdentity {
            namespace: "ns".into(),
            pod: "origin".into(),
        },
    )
    .await
    .unwrap();
    let edge = MockEdge::start().await.unwrap();
    // Pushed before `cloudflared` exists: it gets the configuration when it registers.
    edge.push_config(1, &ingress(&echo)).await;
    let dir = tempdir::Dir::new();
    let cloudflared = spawn_cloudflared(&edge, &dir, protocol, ha).await;
    edge.wait_serving(ha).await;
    edge.wait_configured(ha).await;
    Setup {
        edge,
        echo,
        cloudflared,
        _dir: dir,
    }
}

type Eyeball = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn eyeball() -> Eyeball {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    client: &Eyeball,
    edge: SocketAddr,
    req: http::request::Builder,
    body: Bytes,
) -> (StatusCode, Bytes) {
    let path = req
        .uri_ref()
        .map_or_else(|| "/".to_owned(), ToString::to_string);
    let req = req
        .uri(format!("http://{edge}{path}"))
        .header("host", HOST)
        .body(Full::new(body))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// A GET with a Latin-1 header value, and the echo's JSON answer (`null` if not JSON).
async fn get(edge: SocketAddr, path_and_query: &str) -> (StatusCode, Value) {
    let req = Request::get(path_and_query).header("x-latin", &b"caf\xe9"[..]);
    let (status, body) = send(&eyeball(), edge, req, Bytes::new()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn serves_through_cloudflared(protocol: &str) {
    let s = setup(protocol, 2).await;
    let http = s.edge.http_addr();
    // What `cloudflared` registers with, as the connector in this repository sends it.
    let records = s.edge.registrations();
    let mut indexes: Vec<u8> = records.iter().map(|r| r.conn_index).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1], "{records:?}");
    for r in &records {
        assert_eq!(r.tunnel_secret.len(), 32);
        assert_eq!(r.tunnel_id.len(), 16);
        assert_eq!(r.client_id, records[0].client_id, "one connector id");
        assert_eq!(
            r.origin_local_ip,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 127, 0, 0, 1]
        );
        assert_eq!(r.num_previous_attempts, 0);
        for f in [
            "allow_remote_config",
            "serialized_headers",
            "support_quic_eof",
        ] {
            assert!(r.features.iter().any(|x| x == f), "{f}: {r:?}");
        }
    }

    // Routing by the configuration received at registration, edge headers, raw header bytes.
    let (status, json) = get(http, "/a/b?c=d").await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["path"], "/a/b?c=d");
    assert_eq!(json["host"], HOST);
    assert_eq!(json["headers"]["Cf-Connecting-Ip"][0], "127.0.0.1");
    assert_eq!(json["headers"]["Cdn-Loop"][0], "cloudflare");
    assert!(json["headers"]["X-Latin"].is_array(), "{json}");
    let (status, _) = send(
        &eyeball(),
        http,
        Request::get("/").header("host", "other.example.com"),
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the catch-all rule");
    // An origin `cloudflared` cannot reach: the edge's own 502 with a body saying why, over
    // QUIC from the error `ConnectResponse`, over HTTP/2 from the response marked as
    // `cloudflared`'s.
    let req = Request::get(format!("http://{http}/"))
        .header("host", UNREACHABLE)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = eyeball().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty(), "an empty 502 over {protocol}");

    // Uploads: a sized body, and an HTTP/2 eyeball's body without a length.
    let big = Bytes::from(vec![7u8; 3 << 20]);
    let (status, _) = send(&eyeball(), http, Request::post("/upload"), big).await;
    assert_eq!(status, StatusCode::OK);
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<BoxBody<Bytes, Infallible>>();
    let frames = (0..48).map(|_| Ok(http_body::Frame::data(Bytes::from_static(&[1u8; 65536]))));
    let req = Request::post(format!("http://{http}/stream"))
        .header("host", HOST)
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap();
    let resp = h2.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // Many requests at once.
    let client = eyeball();
    let all = futures_util::future::join_all((0..200).map(|i| {
        let client = client.clone();
        async move {
            send(&client, http, Request::get(format!("/c{i}")), Bytes::new())
                .await
                .0
        }
    }))
    .await;
    assert!(all.iter().all(|s| *s == StatusCode::OK), "{all:?}");

    // WebSocket echo.
    let ws_req = Request::get(format!("ws://{http}/ws"))
        .header("host", HOST)
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .body(())
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::connect_async(ws_req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("through cloudflared")).await.unwrap();
    let back = ws.next().await.unwrap().unwrap();
    assert_eq!(back, Message::text("through cloudflared"));
    drop(ws);
    // An upgrade the origin turns down (a plain 200) reaches the eyeball as that 200.
    let (status, body) = send(
        &eyeball(),
        http,
        Request::get("/not-ws")
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-version", "13"),
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["path"], "/not-ws");

    // A private-network (TCP) stream as the edge opens one for WARP traffic: `cloudflared`
    // dials the destination and pipes bytes both ways; a destination that refuses the dial
    // is refused back to the edge.
    let tcp_echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp_echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = tcp_echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut pipe = s.edge.open_tcp(tcp_addr).await.unwrap();
    pipe.write_all(b"through a TCP stream").await.unwrap();
    let mut back = [0u8; 20];
    pipe.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"through a TCP stream");
    drop(pipe);
    let (closed_addr, _held) =
        cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
    match s.edge.open_tcp(closed_addr).await {
        Err(cftunnel_testkit::edge::MockEdgeError::Rejected(reason)) => {
            eprintln!("cloudflared refused a TCP stream ({protocol}): {reason}");
        }
        other => panic!("a refused dial was not refused back: {other:?}"),
    }

    // Later pushes: a newer version is applied everywhere, an older one is not.
    let acks = s.edge.push_config(3, &ingress(&s.echo)).await;
    assert!(acks.iter().all(|a| matches!(a, Ok(3))), "{acks:?}");
    let acks = s.edge.push_config(2, &ingress(&s.echo)).await;
    assert!(acks.iter().all(|a| matches!(a, Ok(3))), "{acks:?}");

    // Drain: SIGTERM unregisters every connection; the request in flight finishes,
    // and new ones get what Cloudflare answers for a tunnel with no connector.
    let in_flight = tokio::spawn(async move { get(http, "/slow?delay=2s").await.0 });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = s.cloudflared.id().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    s.edge.wait_serving(0).await;
    let (status, body) = send(&eyeball(), http, Request::get("/after"), Bytes::new()).await;
    assert_eq!(
        (status.as_u16(), &body[..]),
        (530, &b"error code: 1033\n"[..])
    );
    assert_eq!(in_flight.await.unwrap(), StatusCode::OK);
    let mut cloudflared = s.cloudflared;
    let exit = cloudflared.wait().await.unwrap();
    assert!(exit.success(), "{exit}");
    s.edge.shutdown().await;
}

/// A refused registration reaches `cloudflared` with its cause: over QUIC it retries
/// and registers once the edge accepts again; over HTTP/2 a refused first connection
/// ends the process ("initial tunnel connection failed").
async fn refusals_reach_cloudflared(protocol: &str) {
    let edge = MockEdge::start().await.unwrap();
    edge.set_registration_error(Some(EdgeRefusal {
        cause: "server busy".into(),
        retry_after: Duration::ZERO,
        should_retry: true,
    }));
    let dir = tempdir::Dir::new();
    let mut cloudflared = spawn_cloudflared(&edge, &dir, protocol, 1).await;
    wait_until(|| !edge.registrations().is_empty()).await;
    if protocol == "http2" {
        let exit = cloudflared.wait().await.unwrap();
        assert!(!exit.success(), "{exit}");
    } else {
        wait_until(|| edge.registrations().len() >= 2).await;
        edge.set_registration_error(None);
        edge.wait_serving(1).await;
    }
    edge.shutdown().await;
}

/// The workspace's `cftunnel-proxy` (release first).
fn proxy_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("cftunnel-proxy"))
        .find(|p| p.is_file())
        .expect("build cftunnel-proxy first (cargo build --release -p cftunnel-proxy)")
}

/// `cloudflared` and the proxy serve one tunnel side by side, and load keeps flowing
/// while `cloudflared` is stopped: the drop-in replacement of a `cloudflared` fleet,
/// without a failed request.
async fn a_mixed_fleet_hands_over_without_failed_requests() {
    let s = setup("http2", 2).await;
    let http = s.edge.http_addr();
    let dir = tempdir::Dir::new();
    let ca = dir.0.join("ca.pem");
    s.edge.write_ca_pem(&ca).await.unwrap();
    let config = dir.0.join("proxy.json");
    let doc = serde_json::json!({
        "version": 1,
        "rules": [{ "backends": [{ "url": format!("http://{}", s.echo.http_addr()), "weight": 1 }] }]
    });
    std::fs::write(&config, doc.to_string()).unwrap();
    let edge = s.edge.edge_addr().to_string();
    let _proxy = Command::new(proxy_bin())
        .arg("--config-file")
        .arg(&config)
        .env("PROXY_CONFIG_ADDR", "127.0.0.1:0")
        .env("PROXY_GRACE_PERIOD", "5s")
        .env("TUNNEL_TOKEN", token())
        .env("TUNNEL_EDGE", format!("{edge},{edge}"))
        .env("TUNNEL_CACERT", &ca)
        .env("PROXY_TUNNEL_PROTOCOL", "quic")
        .env_remove("PROXY_AUTH_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    s.edge.wait_serving(4).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = eyeball();
                let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let req = Request::get(format!("http://{http}/mix?delay=20ms"))
                        .header("host", HOST)
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let key = match client.request(req).await {
                        Ok(resp) => {
                            let status = resp.status();
                            match resp.into_body().collect().await {
                                Ok(_) => status.as_u16().to_string(),
                                Err(e) => format!("body: {e}"),
                            }
                        }
                        Err(e) => format!("request: {e}"),
                    };
                    *outcomes.entry(key).or_default() += 1;
                }
                outcomes
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = s.cloudflared.id().unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let mut cloudflared = s.cloudflared;
    assert!(cloudflared.wait().await.unwrap().success());
    s.edge.wait_serving(2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = std::collections::BTreeMap::<String, usize>::new();
    for task in load {
        for (k, n) in task.await.unwrap() {
            *total.entry(k).or_default() += n;
        }
    }
    assert_eq!(total.keys().collect::<Vec<_>>(), ["200"], "{total:?}");
    assert!(total["200"] > 500, "{total:?}");
    s.edge.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cloudflared binary (CLOUDFLARED) and a built cftunnel-proxy"]
async fn a_mixed_fleet_with_cloudflared_hands_over_without_failed_requests() {
    tokio::time::timeout(LIMIT, a_mixed_fleet_hands_over_without_failed_requests())
        .await
        .expect("finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cloudflared binary: set CLOUDFLARED"]
async fn cloudflared_serves_through_the_mock_edge_over_quic() {
    tokio::time::timeout(LIMIT, serves_through_cloudflared("quic"))
        .await
        .expect("finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cloudflared binary: set CLOUDFLARED"]
async fn cloudflared_serves_through_the_mock_edge_over_http2() {
    tokio::time::timeout(LIMIT, serves_through_cloudflared("http2"))
        .await
        .expect("finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cloudflared binary: set CLOUDFLARED"]
async fn cloudflared_retries_refusals_over_quic() {
    tokio::time::timeout(LIMIT, refusals_reach_cloudflared("quic"))
        .await
        .expect("finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cloudflared binary: set CLOUDFLARED"]
async fn cloudflared_exits_on_a_refused_first_connection_over_http2() {
    tokio::time::timeout(LIMIT, refusals_reach_cloudflared("http2"))
        .await
        .expect("finished in time");
}
