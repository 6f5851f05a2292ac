//! A streaming call on a rule that mirrors or retries: its body is read for a replay only for
//! a short while, however steadily it comes, and then streams on to the backend.

use crate::support::*;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// When something happened, once.
type Moment = Arc<Mutex<Option<Instant>>>;

fn note(moment: &Moment) {
    moment
        .lock()
        .expect("lock")
        .get_or_insert_with(Instant::now);
}

/// An h2c backend that notes when the first DATA of a call's body arrives, reads the body on
/// and answers once it ends.
async fn first_data_noting_backend(first_data: Moment) -> SocketAddr {
    scripted_backend(move |conn| {
        let first_data = first_data.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let first_data = first_data.clone();
            async move {
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(frame) if frame.data_ref().is_some_and(|d| !d.is_empty()) => {
                            note(&first_data)
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                let mut response = Response::new(Full::new(Bytes::new()));
                response.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/grpc"),
                );
                response
                    .headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static("0"));
                Ok::<_, Infallible>(response)
            }
        });
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
    })
    .await
}

/// A client-streaming gRPC body: a 100-byte message every 20 ms, for `messages` messages;
/// `first_sent` notes when the first is handed to the connection.
fn steady_messages(
    messages: usize,
    first_sent: Moment,
) -> StreamBody<futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, Infallible>>>
{
    use futures_util::StreamExt as _;
    let mut message = vec![0u8, 0, 0, 0, 100];
    message.extend_from_slice(&[7u8; 100]);
    let message = Bytes::from(message);
    let stream = futures_util::stream::unfold(0, move |sent| {
        let message = message.clone();
        let first_sent = first_sent.clone();
        async move {
            if sent == messages {
                return None;
            }
            if sent > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            } else {
                note(&first_sent);
            }
            Some((Ok(http_body::Frame::data(message)), sent + 1))
        }
    });
    StreamBody::new(stream.boxed())
}

/// A call sending a message every 20 ms never pauses long enough to be streamed on for a
/// lull: still, its backend sees its first message at once, not once 64 KiB have come.
#[tokio::test]
async fn a_steady_client_stream_on_a_mirrored_or_retried_rule_reaches_its_backend_at_once() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mirror = echo("mirror-1").await;
        let proxy = proxy().await;
        let http = client();
        for (name, extra) in [
            (
                "mirrored",
                json!({"filters": [{"type": "RequestMirror", "requestMirror": {"backendUrl": url(mirror.http_addr())}}]}),
            ),
            (
                "retried",
                json!({"retry": {"codes": [503], "attempts": 2}}),
            ),
        ] {
            let first_data: Moment = Arc::default();
            let backend = first_data_noting_backend(first_data.clone()).await;
            let mut rule = json!({"backends": [{"url": url(backend), "weight": 1, "protocol": "h2c"}]});
            for (k, v) in extra.as_object().expect("object") {
                rule[k] = v.clone();
            }
            assert_eq!(
                push(&http, proxy.admin_addr(), &json!({"rules": [rule]})).await.status,
                StatusCode::OK
            );
            let (mut sender, _conn) = cftunnel_testkit::client::connect_h2c(proxy.data_addr())
                .await
                .expect("connect");
            let first_sent: Moment = Arc::default();
            // 10 s of messages: 50 KiB, short of the 64 KiB a replay may hold.
            let req = Request::post("http://h/pkg.Svc/Upload")
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(steady_messages(500, first_sent.clone()))
                .expect("request");
            let call = tokio::spawn(async move { sender.send_request(req).await });
            let by = Instant::now() + Duration::from_secs(3);
            let arrived = loop {
                if let Some(at) = *first_data.lock().expect("lock") {
                    break at;
                }
                assert!(
                    Instant::now() < by,
                    "{name}: the backend saw nothing of the call for 3 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let sent = first_sent.lock().expect("lock").expect("the first message was sent");
            let took = arrived.duration_since(sent);
            assert!(
                took < Duration::from_millis(300),
                "{name}: the first message reached the backend {took:?} after it was sent"
            );
            call.abort();
        }
    })
    .await
    .expect("test finished in time");
}
