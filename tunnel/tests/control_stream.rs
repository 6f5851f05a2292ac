//! The control stream's RPC session as the edge sees it, against a bare QUIC edge that
//! answers `registerConnection` with a refusal: how the connector ends the session.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use capnp_rpc::rpc_capnp::message;
use cftunnel_testkit::connector::token;
use cftunnel_testkit::edge::rpc::{serve_registration, RegistrationHooks, RegistrationRecord};
use cftunnel_testkit::pki::TestPki;
use cftunnel_tunnel::rpc::{LocalWorker, RpcStream};
use cftunnel_tunnel::{
    tls, ConnectionDetails, Connector, ConnectorOptions, EdgeRefusal, Protocol, TunnelMetrics,
};
use http_body_util::Empty;
use tokio::io::{AsyncRead, ReadBuf};

struct Refuse;

impl RegistrationHooks for Refuse {
    fn register(&self, _: RegistrationRecord) -> Result<ConnectionDetails, EdgeRefusal> {
        Err(EdgeRefusal {
            cause: "Unauthorized: bad secret".into(),
            retry_after: Duration::ZERO,
            should_retry: false,
        })
    }
    fn unregister(&self) {}
    fn local_config(&self, _: Vec<u8>) {}
}

/// The edge's reading half, keeping a copy of every byte.
struct Tap<R> {
    inner: R,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Tap<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            self.seen
                .lock()
                .unwrap()
                .extend_from_slice(&buf.filled()[before..]);
        }
        res
    }
}

/// The RPC messages in a captured byte stream, by their union discriminant.
fn kinds(mut bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let msg =
            capnp::serialize::read_message(&mut bytes, Default::default()).expect("framed message");
        let root: message::Reader<'_> = msg.get_root().expect("rpc message");
        out.push(match root.which() {
            Ok(which) => which_discriminant(&which),
            Err(e) => e.0,
        });
    }
    out
}

fn which_discriminant(w: &message::WhichReader<'_>) -> u16 {
    match w {
        message::Unimplemented(_) => 0,
        message::Abort(_) => 1,
        message::Call(_) => 2,
        message::Return(_) => 3,
        message::Finish(_) => 4,
        message::Resolve(_) => 5,
        message::Release(_) => 6,
        message::ObsoleteSave(_) => 7,
        message::Bootstrap(_) => 8,
        _ => 99,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_aborts_the_session_and_ends_the_stream() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let pki = TestPki::generate().unwrap();
        let server = pki.quic_server(tls::provider()).unwrap();
        let endpoint =
            quinn::Endpoint::server(server, SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let opts = ConnectorOptions {
            protocol: Protocol::Quic,
            edges: vec![endpoint.local_addr().unwrap().into()],
            edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
            ha_connections: 1,
            // The refusal is reported once; no second attempt meanwhile.
            backoff_base: Duration::from_secs(30),
            ..ConnectorOptions::default()
        };
        let service = hyper::service::service_fn(|_req| async {
            Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new()))
        });
        let mut registry = prometheus_client::registry::Registry::default();
        let handle = Connector::new(token(), opts)
            .unwrap()
            .start(service, TunnelMetrics::register(&mut registry))
            .unwrap();

        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let worker = LocalWorker::start("control-test").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tap = Tap {
            inner: recv,
            seen: seen.clone(),
        };
        let edge_done = serve_registration(
            &worker,
            RpcStream {
                reader: tap,
                writer: send,
            },
            Arc::new(Refuse),
        )
        .await
        .unwrap();

        // The connector reports the refusal.
        let refused =
            "cftunnel_tunnel_registration_failures_total{protocol=\"quic\",cause=\"unauthorized\"} 1";
        loop {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            if text.lines().any(|l| l == refused) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // By the time the refusal is reported the edge has the connector's Abort: the
        // session was closed, not cut off.
        tokio::time::timeout(Duration::from_secs(2), edge_done)
            .await
            .expect("edge session ended")
            .unwrap();
        let kinds = kinds(&seen.lock().unwrap());
        assert_eq!(kinds.first(), Some(&8), "bootstrap first: {kinds:?}");
        assert_eq!(kinds.last(), Some(&1), "abort last: {kinds:?}");
        drop(handle);
    })
    .await
    .expect("test finished in time");
}
