//! End-to-end over real QUIC and TLS/TCP sockets on 127.0.0.1: a connector
//! registers with the mock edge and serves requests forwarded by it.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use bytes::Bytes;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::Protocol;
use futures_util::future::join_all;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn serves_requests(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let token = token();
    let (handle, _m, registry) = start_connector(options(&edge, protocol, 2), token.clone());
    handle.wait_registered(2).await;
    edge.wait_serving(2).await;
    let records = edge.registrations();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].tunnel_id, token.tunnel_id().as_bytes());
    assert_eq!(records[0].tunnel_secret, token.tunnel_secret());
    assert_eq!(records[0].client_id, handle.connector_id().as_bytes());
    assert!(records[0]
        .features
        .contains(&"serialized_headers".to_string()));
    assert_eq!(
        records[0].origin_local_ip,
        std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()
    );
    assert_eq!(records[0].version, cftunnel_tunnel::DEFAULT_CLIENT_VERSION);
    assert!(records[0].arch.contains('_'), "{}", records[0].arch);
    // Go's GOOS_GOARCH, as `cloudflared` sends it.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    assert_eq!(records[0].arch, "linux_amd64");
    #[cfg(all(target_os = "linux", target_arch = "aarch64"))]
    assert_eq!(records[0].arch, "linux_arm64");
    #[cfg(all(target_os = "macos", target_arch = "aarch64"))]
    assert_eq!(records[0].arch, "darwin_arm64");
    assert_eq!(records[0].num_previous_attempts, 0);
    let mut idx: Vec<u8> = records.iter().map(|r| r.conn_index).collect();
    idx.sort();
    assert_eq!(idx, vec![0, 1]);

    let client = pooled();
    let (status, headers, body) = get(&client, edge.http_addr(), "/hello").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "hello");
    assert_eq!(headers["x-host"], "app.example.com");
    assert_eq!(headers["x-uri"], "https://app.example.com/hello");
    assert_eq!(headers["x-version"], "HTTP/1.1");
    assert_eq!(headers.get_all("set-cookie").iter().count(), 2);
    let (status, _, _) = get(&client, edge.http_addr(), "/missing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let label = match protocol {
        Protocol::Http2 => "http2",
        _ => "quic",
    };
    let text = metrics_text(&registry);
    assert!(
        text.contains(&format!(
            "cftunnel_tunnel_connections{{protocol=\"{label}\"}} 2"
        )),
        "{text}"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

/// `originLocalIp` as `cloudflared` sends it: 16 bytes, the edge's address over QUIC and
/// the connection's local address over HTTP/2. The edge listens on 127.0.0.2, the
/// connector's side is 127.0.0.1.
async fn origin_local_ip_is_sent_as_cloudflared_sends_it(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::builder()
        .edge_addr("127.0.0.2:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let expected = match protocol {
        Protocol::Http2 => std::net::Ipv4Addr::LOCALHOST,
        _ => std::net::Ipv4Addr::new(127, 0, 0, 2),
    };
    let records = edge.registrations();
    assert_eq!(
        records[0].origin_local_ip,
        expected.to_ipv6_mapped().octets()
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn streams_large_bodies(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, _m, _r) = start_connector(options(&edge, protocol, 1), token());
    handle.wait_registered(1).await;
    let client = pooled();
    const N: usize = 16 * 1024 * 1024;
    let (status, _, body) = get(&client, edge.http_addr(), &format!("/download?n={N}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), N);

    let payload: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    let req = Request::post(format!("http://{}/echo", edge.http_addr()))
        .header("host", "app.example.com")
        .body(
            Full::new(Bytes::from(payload.clone()))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "echoed body differs");
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn many_concurrent_requests(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 4).await;
    let client = pooled_h2c::<TestBody>();
    let addr = edge.http_addr();
    let results = join_all((0..1000).map(|i| {
        let client = client.clone();
        async move {
            let req = Request::post(format!("http://{addr}/echo"))
                .header("host", "app.example.com")
                .header("content-length", "8")
                .body(
                    Full::new(Bytes::from(format!("{i:08}")))
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                )
                .unwrap();
            let resp = client.request(req).await.expect("request completes");
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body == format!("{i:08}"))
        }
    }))
    .await;
    assert!(results.iter().all(|(s, ok)| *s == StatusCode::OK && *ok));
    let spread = edge.connections();
    assert!(spread.iter().all(|c| c.requests > 0), "{spread:?}");
    handle.shutdown().await;
    edge.shutdown().await;
}

async fn websocket_echo(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let (handle, _m, _r) = start_connector(options(&edge, protocol, 1), token());
    handle.wait_registered(1).await;
    let (status, mut ws) = websocket(edge.http_addr()).await;
    assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
    for msg in [&b"ping"[..], &[0u8; 70_000][..]] {
        ws.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        ws.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }
    handle.shutdown().await;
    edge.shutdown().await;
}

/// `MockEdge::request` (the load generator's way in) forwards as the HTTP listener does:
/// edge headers added, bodies streamed both ways, spread over the connections.
async fn in_process_requests_cross_the_tunnel(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 2).await;
    for _ in 0..4 {
        let req = http::Request::get("/hello")
            .header("host", "app.example.com")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = edge.request(req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
    }
    let payload = bytes::Bytes::from(vec![b'x'; 300_000]);
    let req = http::Request::post("/echo")
        .header("host", "app.example.com")
        .header("content-length", payload.len())
        .body(http_body_util::Full::new(payload.clone()))
        .unwrap();
    let resp = edge.request(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, payload, "the upload came back whole");
    let served: u64 = edge.connections().iter().map(|c| c.requests).sum();
    assert_eq!(served, 5);
    assert!(
        edge.connections().iter().all(|c| c.requests >= 1),
        "requests are spread over both connections: {:?}",
        edge.connections()
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

/// A response head reaches the eyeball as soon as the service has it, not with
/// the first body bytes (a stream, a long poll).
async fn heads_do_not_wait_for_late_bodies(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let client = pooled();
    let req = get_request(edge.http_addr(), "/late-body");
    let start = std::time::Instant::now();
    let resp = client.request(req).await.expect("response head");
    let head_after = start.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body_after = start.elapsed();
    assert_eq!(body, "late");
    assert!(
        body_after >= std::time::Duration::from_secs(2),
        "{body_after:?}"
    );
    assert!(
        head_after < std::time::Duration::from_millis(1500),
        "head held back with the body: {head_after:?} ({label})",
        label = label(protocol)
    );
    handle.shutdown().await;
}

/// A response ends at the eyeball when its body says it has ended, without a
/// further poll of the body.
async fn responses_end_when_the_body_says_so(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let req = get_request(edge.http_addr(), "/ended-body");
    let resp = pooled().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        resp.into_body().collect(),
    )
    .await
    .unwrap_or_else(|_| panic!("the response never ended ({})", label(protocol)))
    .unwrap()
    .to_bytes();
    assert_eq!(body, "ended");
    handle.shutdown().await;
    edge.shutdown().await;
}

/// A response whose body fails partway is cut off at the eyeball, not passed on as a
/// complete response, even when the failure unwinds the stream's task.
async fn cut_off_responses_are_not_completed(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let req = get_request(edge.http_addr(), "/cut-body");
    // Depending on how far the response got before the failure, the eyeball sees its
    // request fail, a 502, or a body that breaks off; never a 200 that ends cleanly.
    let outcome = match pooled().request(req).await {
        Err(e) => Err(e.to_string()),
        Ok(resp) => {
            let status = resp.status();
            match resp.into_body().collect().await {
                Ok(body) => Ok((status, body.to_bytes())),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    assert!(
        !matches!(&outcome, Ok((StatusCode::OK, _))),
        "a cut-off body arrived as complete ({}): {outcome:?}",
        label(protocol),
    );
    // The connection keeps serving.
    let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(serves_requests);
per_transport!(origin_local_ip_is_sent_as_cloudflared_sends_it);
per_transport!(cut_off_responses_are_not_completed);
per_transport!(responses_end_when_the_body_says_so);
per_transport!(heads_do_not_wait_for_late_bodies);
per_transport!(in_process_requests_cross_the_tunnel);
per_transport!(streams_large_bodies);
per_transport!(many_concurrent_requests);
per_transport!(websocket_echo);

/// An origin that answers a WebSocket request with a plain 200 turned the upgrade down:
/// the eyeball gets that answer, body and all, not a 101 (over HTTP/2 both arrive as 200).
async fn a_refused_upgrade_is_the_origins_answer(protocol: Protocol) {
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let resp = upgrade_request(edge.http_addr(), "/hello").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        !resp.headers().contains_key("upgrade"),
        "{:?}",
        resp.headers()
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(a_refused_upgrade_is_the_origins_answer);

/// The connector grants the edge `quic_max_streams` request streams per QUIC connection:
/// more requests than that wait at the edge for a stream to finish, and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_opens_at_most_the_granted_quic_streams() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let opts = cftunnel_tunnel::ConnectorOptions {
            quic_max_streams: 2,
            ..options(&edge, Protocol::Quic, 1)
        };
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (now2, peak2) = (now.clone(), peak.clone());
        let service = hyper::service::service_fn(move |req| {
            let (now, peak) = (now2.clone(), peak2.clone());
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                echo(req).await
            }
        });
        let connector =
            cftunnel_tunnel::Connector::new(token(), opts).expect("connector options are valid");
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = cftunnel_tunnel::TunnelMetrics::register(&mut registry);
        let handle = connector.start(service, metrics).expect("connector starts");
        handle.wait_registered(1).await;
        edge.wait_serving(1).await;
        let client = pooled_h2c();
        let addr = edge.http_addr();
        let results = join_all((0..6).map(|_| {
            let client = client.clone();
            async move { get(&client, addr, "/hello").await }
        }))
        .await;
        assert!(results
            .iter()
            .all(|(s, _, b)| *s == StatusCode::OK && &b[..] == b"hello"));
        assert_eq!(peak.load(Ordering::SeqCst), 2, "streams open at once");
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// An HTTP/2 eyeball may send a body without `Content-Length`; it still reaches
/// the origin, over either transport.
async fn h2_eyeball_bodies_without_a_length_arrive(protocol: Protocol) {
    trace_init();
    let edge = MockEdge::start().await.unwrap();
    let handle = serving_connector(&edge, protocol, 1).await;
    let chunks = futures_util::stream::iter(["first ", "second"].map(|c| {
        Ok::<_, cftunnel_tunnel::BoxError>(http_body::Frame::data(Bytes::from_static(c.as_bytes())))
    }));
    let req = Request::post(format!("http://{}/echo", edge.http_addr()))
        .header("host", "app.example.com")
        .body(http_body_util::StreamBody::new(chunks).boxed_unsync())
        .unwrap();
    assert!(!req.headers().contains_key("content-length"));
    let resp = pooled_h2c().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{}", label(protocol));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"first second", "{}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(h2_eyeball_bodies_without_a_length_arrive);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_the_edge_over_http2() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let (handle, _m, _r) = start_connector(options(&edge, Protocol::Http2, 1), token());
        handle.wait_registered(1).await;
        let req = Request::post(format!("http://{}/trailers", edge.http_addr()))
            .header("host", "grpc.example.com")
            .body(empty())
            .unwrap();
        let resp = pooled_h2c().request(req).await.unwrap();
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers arrive");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(collected.to_bytes(), "data");
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Over QUIC a response's trailers cannot reach the edge: the body still does, and the drop is
/// counted, so a gRPC service losing its status this way shows on `/metrics`. Over HTTP/2 they
/// arrive and nothing is counted.
async fn dropped_trailers_are_counted_over_quic_only(protocol: Protocol) {
    let edge = MockEdge::start().await.unwrap();
    let (handle, _m, registry) = start_connector(options(&edge, protocol, 1), token());
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;
    let series = "cftunnel_tunnel_dropped_response_trailers_total";
    let dropped = |registry: &prometheus_client::registry::Registry| {
        let text = metrics_text(registry);
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{series} is served:\n{text}"))
    };
    assert_eq!(dropped(&registry), 0, "{}", label(protocol));
    for _ in 0..2 {
        let req = Request::post(format!("http://{}/trailers", edge.http_addr()))
            .header("host", "grpc.example.com")
            .body(empty())
            .unwrap();
        let resp = pooled_h2c().request(req).await.unwrap();
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "data", "{}", label(protocol));
        assert_eq!(
            trailers.is_some(),
            protocol == Protocol::Http2,
            "{}",
            label(protocol)
        );
    }
    let expected = if protocol == Protocol::Http2 { 0 } else { 2 };
    assert_eq!(dropped(&registry), expected, "{}", label(protocol));
    handle.shutdown().await;
    edge.shutdown().await;
}

per_transport!(dropped_trailers_are_counted_over_quic_only);

/// A request `dest` with bytes Go's URL parser takes and `http::Uri` does not (raw spaces,
/// `<`, `>`, quotes, backticks, bytes that are not UTF-8) is served with those bytes
/// percent-encoded, as `cloudflared` serves it; one with a control character is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_urls_go_accepts_are_served() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        // `@` stands for the byte 0xE9 and `~` for 0xFF, set in the encoded message:
        // `ConnectRequest` holds a `String`.
        let request = |dest: &str| {
            let mut bytes = cftunnel_tunnel::stream::encode_connect_request(
                &cftunnel_tunnel::stream::ConnectRequest {
                    dest: dest.into(),
                    kind: cftunnel_tunnel::stream::ConnectionType::Http,
                    metadata: vec![cftunnel_tunnel::stream::Metadata::new("HttpMethod", "GET")],
                },
            );
            let at = bytes
                .windows(dest.len())
                .position(|w| w == dest.as_bytes())
                .unwrap();
            for b in &mut bytes[at..at + dest.len()] {
                match *b {
                    b'@' => *b = 0xe9,
                    b'~' => *b = 0xff,
                    _ => {}
                }
            }
            bytes
        };
        let cases = [
            (
                "https://a.example/uri/a b<c>`d?q=\"x y\"<>",
                "https://a.example/uri/a%20b%3Cc%3E%60d?q=%22x%20y%22%3C%3E",
            ),
            (
                "https://a.example/uri/{\"k\":1}|^?{|}^`",
                "https://a.example/uri/{\"k\":1}|^?{|}^`",
            ),
            (
                "https://a.example/uri/caf@?x=~",
                "https://a.example/uri/caf%E9?x=%FF",
            ),
        ];
        for (dest, expected) in cases {
            let reply = edge.send_raw_quic_stream(&request(dest)).await.unwrap();
            let rest = body_of_200(&reply, dest).await;
            assert_eq!(String::from_utf8_lossy(rest), expected, "{dest}");
        }
        for dest in [
            "https://a.example/uri/a\u{1}b",
            "https://a.example/uri/a?b=\u{7f}",
        ] {
            let reply = edge.send_raw_quic_stream(&request(dest)).await.unwrap();
            let resp = cftunnel_tunnel::stream::read_response_preamble(&mut &reply[..])
                .await
                .unwrap();
            assert!(resp.error.contains("malformed request"), "{dest}: {resp:?}");
        }
        assert_eq!(handle.registered(), 1);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// The preamble of a `POST /echo` announcing a body of ten bytes.
fn post_echo_of_ten() -> Vec<u8> {
    cftunnel_tunnel::stream::encode_connect_request(&cftunnel_tunnel::stream::ConnectRequest {
        dest: "https://a.example/echo".into(),
        kind: cftunnel_tunnel::stream::ConnectionType::Http,
        metadata: vec![
            cftunnel_tunnel::stream::Metadata::new("HttpMethod", "POST"),
            cftunnel_tunnel::stream::Metadata::new("HttpHeader:Content-Length", "10"),
        ],
    })
}

/// The body of a raw stream's reply, which must be a `200` with no error; `case` names the
/// request in a failure.
async fn body_of_200<'a>(reply: &'a [u8], case: &str) -> &'a [u8] {
    let mut rest = reply;
    let resp = cftunnel_tunnel::stream::read_response_preamble(&mut rest)
        .await
        .unwrap();
    assert_eq!(resp.error, "", "{case}");
    assert!(
        resp.metadata
            .iter()
            .any(|m| m.key == "HttpStatus" && m.val == "200"),
        "{case}: {resp:?}"
    );
    rest
}

/// A request whose preamble and body arrive in pieces, cut anywhere (in the signature,
/// the version, the segment table, the message, or between the message and the body), is
/// served as one that arrives at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_in_pieces_is_served_whole() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        let mut bytes = post_echo_of_ten();
        let head = bytes.len();
        bytes.extend_from_slice(b"0123456789");
        let cuts: [&[usize]; 7] = [
            &[3],
            &[6],
            &[10],
            &[20],
            &[head],
            &[head + 4],
            &[1, 7, 12, 15, 16, 30, head - 1, head + 1],
        ];
        for cut in cuts {
            let mut pieces = Vec::new();
            let mut from = 0;
            for &to in cut.iter().chain([&bytes.len()]) {
                pieces.push(&bytes[from..to]);
                from = to;
            }
            let reply = edge
                .send_raw_quic_stream_in_pieces(&pieces, std::time::Duration::from_millis(20))
                .await
                .unwrap();
            let rest = body_of_200(&reply, &format!("{cut:?}")).await;
            assert_eq!(rest, b"0123456789", "{cut:?}");
        }
        assert_eq!(handle.registered(), 1);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// Request heads arriving on one connection hold a bounded amount of memory between them
/// (16 MiB): while heads announcing all of it are still arriving, a further request waits
/// for their share instead of being read, and is served once they are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_on_one_connection_share_a_bounded_budget() {
    use cftunnel_tunnel::stream::{DATA_SIGNATURE, DATA_VERSION, MAX_MESSAGE_BYTES};
    use std::time::{Duration, Instant};
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        // Sixteen heads of the largest size: signature, version and a segment table
        // announcing a 1 MiB message go out at once, the message itself `gap` later.
        let mut announced = [&DATA_SIGNATURE[..], &DATA_VERSION].concat();
        announced.extend_from_slice(&0u32.to_le_bytes());
        announced.extend_from_slice(&(((MAX_MESSAGE_BYTES - 8) / 8) as u32).to_le_bytes());
        let message = vec![0u8; MAX_MESSAGE_BYTES - 8];
        let gap = Duration::from_secs(5);
        let started = Instant::now();
        let pieces = [&announced[..], &message[..]];
        let slow = join_all((0..16).map(|_| edge.send_raw_quic_stream_in_pieces(&pieces, gap)));
        let mut request = post_echo_of_ten();
        request.extend_from_slice(b"0123456789");
        let late = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let reply = edge.send_raw_quic_stream(&request).await.unwrap();
            (started.elapsed(), reply)
        };
        let (_, (served_after, reply)) = tokio::join!(slow, late);
        assert_eq!(body_of_200(&reply, "late request").await, b"0123456789");
        assert!(
            served_after >= gap,
            "a request was read past the connection's budget after {served_after:?}"
        );
        assert_eq!(handle.registered(), 1);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_quic_streams_reset_only_that_stream() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        // Unknown signature, bad version, truncated and corrupt capnp framing.
        let good = cftunnel_tunnel::stream::encode_connect_request(
            &cftunnel_tunnel::stream::ConnectRequest {
                dest: "https://a.example/hello".into(),
                kind: cftunnel_tunnel::stream::ConnectionType::Http,
                metadata: vec![cftunnel_tunnel::stream::Metadata::new("HttpMethod", "GET")],
            },
        );
        let mut bad_version = good.clone();
        bad_version[6] = b'9';
        let mut huge = good[..8].to_vec();
        huge.extend_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        for bytes in [
            &b"garbage!"[..],
            &bad_version,
            &good[..good.len() - 3],
            &huge,
        ] {
            assert!(edge.send_raw_quic_stream(bytes).await.is_err());
        }
        // A body that ends before its Content-Length is an error for the service, which
        // here streams it back: the response is reset instead of finished short.
        let mut short = post_echo_of_ten();
        short.extend_from_slice(b"abc");
        let cut = edge.send_raw_quic_stream(&short).await;
        assert!(cut.is_err(), "short body echoed as complete: {cut:?}");
        // A bad header name is answered with a ConnectResponse error.
        let bad_header = cftunnel_tunnel::stream::encode_connect_request(
            &cftunnel_tunnel::stream::ConnectRequest {
                dest: "https://a.example/hello".into(),
                kind: cftunnel_tunnel::stream::ConnectionType::Http,
                metadata: vec![
                    cftunnel_tunnel::stream::Metadata::new("HttpMethod", "GET"),
                    cftunnel_tunnel::stream::Metadata::new("HttpHeader:Bad Name", "x"),
                ],
            },
        );
        let reply = edge.send_raw_quic_stream(&bad_header).await.unwrap();
        let resp = cftunnel_tunnel::stream::read_response_preamble(&mut &reply[..])
            .await
            .unwrap();
        assert!(resp.error.contains("malformed request"), "{resp:?}");
        // The connection keeps serving.
        assert_eq!(handle.registered(), 1);
        let (status, _, body) = get(&pooled(), edge.http_addr(), "/hello").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
