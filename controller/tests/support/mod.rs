//! What several controller test binaries share: one HTTP/1.1 exchange with a server on
//! loopback, on a connection of its own, an echo backend, manifests of a backend Service, and
//! the polling and status reading of the tests that run the controller.

#![allow(dead_code)]

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// An answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// One request; `None` when the server cannot be reached or drops the connection (a test may
/// be waiting for it to come up).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    bearer: Option<&str>,
    body: &str,
) -> Option<Answer> {
    let (mut sender, _conn) = cftunnel_testkit::client::connect_http1(addr).await.ok()?;
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host)
        .header("content-type", "application/json");
    if let Some(token) = bearer {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).ok()?;
    let res = sender.send_request(req).await.ok()?;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.ok()?.to_bytes();
    Some(Answer { status, body })
}

/// YAML documents of a Service `web` in `namespace` (port 80) whose one ready endpoint is
/// `backend`, as the EndpointSlice controller lists it; ends with a document separator.
pub fn web_service(namespace: &str, backend: SocketAddr) -> String {
    let (ip, port) = (backend.ip(), backend.port());
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {namespace}}}
spec: {{ports: [{{name: http, port: 80, targetPort: {port}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: {namespace}, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
---
"#
    )
}

/// An echo backend on loopback that answers as pod `pod` of `namespace`.
pub async fn echo(namespace: &str, pod: &str) -> cftunnel_testkit::echo::EchoServer {
    cftunnel_testkit::echo::EchoServer::spawn(
        std::net::Ipv4Addr::LOCALHOST.into(),
        cftunnel_testkit::echo::EchoIdentity {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        },
    )
    .await
    .expect("the echo backend starts")
}

/// A YAML manifest as JSON.
pub fn yaml(text: &str) -> serde_json::Value {
    serde_yaml_ng::from_str(text).expect("YAML")
}

/// Polls `check` until it gives a value.
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let by = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            std::time::Instant::now() < by,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Condition `kind` in a list of status conditions.
pub fn condition<'a>(
    conditions: &'a serde_json::Value,
    kind: &str,
) -> Option<&'a serde_json::Value> {
    conditions.as_array()?.iter().find(|c| c["type"] == kind)
}

/// A port in front of `pod` that answers each connection `delay` late.
pub async fn slow_port(
    pod: std::net::SocketAddr,
    delay: std::time::Duration,
) -> std::net::SocketAddr {
    in_front(pod, Pass::Late(delay)).await
}

/// A port in front of `pod` that passes connections on while `open` holds, and closes them at
/// once otherwise: a pod whose config port goes away for a while.
pub async fn gated_port(
    pod: std::net::SocketAddr,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    in_front(pod, Pass::While(open)).await
}

/// A port in front of `pod` that passes every connection on while `open` holds, and otherwise
/// only those whose request line starts with one of `passed`; the others are closed
/// unanswered once their request line is read. (Each config-API call of the controller's
/// comes on a connection of its own.)
pub async fn requests_port(
    pod: std::net::SocketAddr,
    passed: &'static [&'static str],
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    in_front(pod, Pass::Requests(open, passed)).await
}

/// Which connections a port in front of a pod passes on.
enum Pass {
    /// Every one, this long after it is taken.
    Late(std::time::Duration),
    /// Those taken while the flag holds.
    While(std::sync::Arc<std::sync::atomic::AtomicBool>),
    /// Every one while the flag holds, and otherwise those whose request line starts with one
    /// of these.
    Requests(
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        &'static [&'static str],
    ),
}

/// A port in front of `pod` that passes connections on as `pass` says.
async fn in_front(pod: std::net::SocketAddr, pass: Pass) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let pass = std::sync::Arc::new(pass);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            if matches!(&*pass, Pass::While(open) if !open.load(SeqCst)) {
                continue;
            }
            let pass = std::sync::Arc::clone(&pass);
            tokio::spawn(async move {
                // What was read of the request to decide on it, passed on first.
                let mut head = Vec::new();
                match &*pass {
                    Pass::Late(delay) => tokio::time::sleep(*delay).await,
                    Pass::While(_) => {}
                    Pass::Requests(open, passed) => {
                        let mut buf = [0u8; 1024];
                        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8 * 1024 {
                            match conn.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let passes = open.load(SeqCst)
                            || passed.iter().any(|p| head.starts_with(p.as_bytes()));
                        if !passes {
                            return;
                        }
                    }
                }
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(pod).await {
                    if upstream.write_all(&head).await.is_ok() {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    }
                }
            });
        }
    });
    addr
}
