//! What an edge that misbehaves can make the connector keep: texts it sends are kept and
//! logged cut, and an edge that leaves calls open loses the control stream's connection, or
//! the configuration stream.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capnp::traits::ImbueMut as _;
use capnp_rpc::rpc_capnp::message;
use cftunnel_testkit::edge::rpc::{serve_registration, RegistrationHooks, RegistrationRecord};
use cftunnel_testkit::edge::MockEdge;
use cftunnel_testkit::pki::TestPki;
use cftunnel_tunnel::rpc::{LocalWorker, RpcStream};
use cftunnel_tunnel::tunnelrpc_capnp::registration_server;
use cftunnel_tunnel::{tls, ConnectionDetails, ConnectorOptions, EdgeRefusal, Protocol};
use tokio::io::{AsyncRead, AsyncReadExt as _};

use crate::support::*;

/// The lines the connector logs at `info` and above, as an operator reads them. Installed
/// for the test's thread, so the test runs on a current-thread runtime: the connector's
/// tasks run on that thread too.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("cftunnel_tunnel=info"))
            .with_ansi(false)
            .with_writer(self.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The longest line logged, and the number of lines that contain `needle`.
    fn longest_and_count(&self, needle: &str) -> (usize, usize) {
        let text = self.text();
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        (longest, text.lines().filter(|l| l.contains(needle)).count())
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// A megabyte of text, well within a message.
fn long_text(start: &str) -> String {
    format!("{start}{}", "x".repeat(1 << 20))
}

/// The longest log line allowed: the fields the connector logs with the edge's text, and
/// that text cut.
const LINE_BYTES: usize = 1024;

async fn a_long_refusal_is_kept_and_logged_cut(protocol: Protocol) {
    let logs = Logs::default();
    let _logging = logs.install();
    let edge = MockEdge::start().await.unwrap();
    edge.set_registration_error(Some(EdgeRefusal {
        cause: long_text("Unauthorized: "),
        retry_after: Duration::ZERO,
        should_retry: true,
    }));
    let (handle, _metrics, registry) = start_connector(options(&edge, protocol, 1), token());
    // Logged on every retry.
    let refused = "edge refused registration: Unauthorized: xxx";
    wait_until(|| logs.longest_and_count(refused).1 >= 2).await;
    let (longest, _) = logs.longest_and_count(refused);
    assert!(
        longest < LINE_BYTES,
        "a log line of {longest} bytes for a refusal"
    );
    // The cause is still read on the text kept.
    let p = label(protocol);
    let text = metrics_text(&registry);
    assert!(
        text.contains(&format!(
            "cftunnel_tunnel_registration_failures_total{{protocol=\"{p}\",cause=\"unauthorized\"}}"
        )),
        "{text}"
    );
    handle.shutdown().await;
    edge.shutdown().await;
}

#[tokio::test]
async fn a_long_refusal_is_kept_and_logged_cut_quic() {
    tokio::time::timeout(LIMIT, a_long_refusal_is_kept_and_logged_cut(Protocol::Quic))
        .await
        .expect("test finished in time");
}

#[tokio::test]
async fn a_long_refusal_is_kept_and_logged_cut_http2() {
    tokio::time::timeout(
        LIMIT,
        a_long_refusal_is_kept_and_logged_cut(Protocol::Http2),
    )
    .await
    .expect("test finished in time");
}

/// A bare QUIC edge's endpoint and a connector with one connection to it.
fn bare_edge() -> (quinn::Endpoint, ConnectorOptions) {
    let pki = TestPki::generate().unwrap();
    let server = pki.quic_server(tls::provider()).unwrap();
    let endpoint = quinn::Endpoint::server(server, SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let opts = ConnectorOptions {
        protocol: Protocol::Quic,
        edges: vec![endpoint.local_addr().unwrap().into()],
        edge_ca_pem: Some(pki.ca_pem().as_bytes().to_vec()),
        ha_connections: 1,
        backoff_base: Duration::from_millis(50),
        ..ConnectorOptions::default()
    };
    (endpoint, opts)
}

/// Registers every connection, at a location with a long name.
struct FarAway;

impl RegistrationHooks for FarAway {
    fn register(&self, _: RegistrationRecord) -> Result<ConnectionDetails, EdgeRefusal> {
        Ok(ConnectionDetails {
            uuid: uuid::Uuid::new_v4(),
            location: long_text("LHR"),
            remotely_managed: false,
        })
    }
    fn unregister(&self) {}
    fn local_config(&self, _: Vec<u8>) {}
}

#[tokio::test]
async fn a_long_location_is_kept_and_logged_cut() {
    tokio::time::timeout(LIMIT, async {
        let logs = Logs::default();
        let _logging = logs.install();
        let (endpoint, opts) = bare_edge();
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let worker = LocalWorker::start("location-test").unwrap();
        let _edge = serve_registration(
            &worker,
            RpcStream {
                reader: recv,
                writer: send,
            },
            Arc::new(FarAway),
        )
        .await
        .unwrap();
        handle.wait_registered(1).await;
        let registered = "registered tunnel connection";
        wait_until(|| logs.longest_and_count(registered).1 >= 1).await;
        let (longest, _) = logs.longest_and_count(registered);
        assert!(
            longest < LINE_BYTES,
            "a log line of {longest} bytes for a registration"
        );
        assert!(logs.text().contains("location=LHRxxx"), "{}", logs.text());
        drop(handle);
    })
    .await
    .expect("test finished in time");
}

/// Reads one framed message; `None` once the stream has ended or failed.
async fn read_frame<R: AsyncRead + Unpin>(
    recv: &mut R,
) -> Option<capnp::message::Reader<capnp::serialize::OwnedSegments>> {
    let mut frame = vec![0u8; 4];
    recv.read_exact(&mut frame).await.ok()?;
    let segments = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize + 1;
    // The segment sizes, padded to a word.
    let table = (4 + 4 * segments).next_multiple_of(8) - 4;
    frame.resize(4 + table, 0);
    recv.read_exact(&mut frame[4..]).await.ok()?;
    let words: usize = frame[4..4 + 4 * segments]
        .chunks(4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()) as usize)
        .sum();
    let head = frame.len();
    frame.resize(head + 8 * words, 0);
    recv.read_exact(&mut frame[head..]).await.ok()?;
    capnp::serialize::read_message(&mut &frame[..], Default::default()).ok()
}

fn framed(build: impl FnOnce(message::Builder<'_>)) -> Vec<u8> {
    let mut m = capnp::message::Builder::new_default();
    build(m.init_root());
    capnp::serialize::write_message_to_words(&m)
}

/// The answer to the connector's bootstrap: the edge's export 0.
fn bootstrap_answer(answer: u32) -> Vec<u8> {
    framed(|m| {
        let mut ret = m.init_return();
        ret.set_answer_id(answer);
        let mut payload = ret.init_results();
        let mut caps = Vec::new();
        {
            let mut content = payload.reborrow().get_content();
            content.imbue_mut(&mut caps);
            let hook = capnp_rpc::new_broken_cap(capnp::Error::failed("not served".into())).hook;
            content.set_as_capability(hook);
        }
        payload.init_cap_table(1).get(0).set_sender_hosted(0);
    })
}

/// The answer to `registerConnection`: registered.
fn registered_answer(answer: u32) -> Vec<u8> {
    framed(|m| {
        let mut ret = m.init_return();
        ret.set_answer_id(answer);
        let results = ret.init_results().get_content();
        let mut details = results
            .init_as::<registration_server::register_connection_results::Builder<'_>>()
            .init_result()
            .init_result()
            .init_connection_details();
        details.set_uuid(uuid::Uuid::new_v4().as_bytes());
        details.set_location_name("MCK");
    })
}

fn bootstrap(question: u32) -> Vec<u8> {
    framed(|m| m.init_bootstrap().set_question_id(question))
}

/// An edge that registers the connection, then asks for the connector's bootstrap over and
/// over on the control stream, never finishing a call: the connector ends the connection
/// instead of keeping an answer to each, and dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_that_leaves_calls_open_on_the_control_stream_loses_the_connection() {
    tokio::time::timeout(LIMIT, async {
        let (endpoint, opts) = bare_edge();
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();

        // The connector's bootstrap and its `registerConnection` call, pipelined on it.
        let (mut bootstrap_q, mut register_q) = (None, None);
        while bootstrap_q.is_none() || register_q.is_none() {
            let msg = read_frame(&mut recv)
                .await
                .expect("the connector's message");
            match msg
                .get_root::<message::Reader<'_>>()
                .unwrap()
                .which()
                .unwrap()
            {
                message::Bootstrap(b) => bootstrap_q = Some(b.unwrap().get_question_id()),
                message::Call(c) => register_q = Some(c.unwrap().get_question_id()),
                _ => {}
            }
        }
        send.write_all(&bootstrap_answer(bootstrap_q.unwrap()))
            .await
            .unwrap();
        send.write_all(&registered_answer(register_q.unwrap()))
            .await
            .unwrap();
        handle.wait_registered(1).await;

        // What the connector sends from now on: the answers to the flood, counted.
        let answers = tokio::spawn(async move {
            let mut answers = 0usize;
            while let Some(msg) = read_frame(&mut recv).await {
                if let Ok(message::Return(_)) =
                    msg.get_root::<message::Reader<'_>>().unwrap().which()
                {
                    answers += 1;
                }
            }
            answers
        });
        const FLOOD: u32 = 10_000;
        for question in 100..100 + FLOOD {
            if send.write_all(&bootstrap(question)).await.is_err() {
                break;
            }
        }
        let answered = tokio::time::timeout(Duration::from_secs(10), answers)
            .await
            .expect("the connector ended the control stream")
            .unwrap();
        assert!(
            answered < 100,
            "{answered} of {FLOOD} calls left open were answered"
        );
        let mut registered = handle.subscribe_registered();
        registered.wait_for(|n| *n == 0).await.unwrap();
        // Lost, so dialed again.
        let again = endpoint.accept().await.expect("the connector dials again");
        again.await.unwrap();
        drop(handle);
    })
    .await
    .expect("test finished in time");
}

/// An edge that opens a configuration stream and asks for the connector's bootstrap over
/// and over, never finishing a call: the connector ends that stream at once instead of
/// keeping an answer to each for as long as the RPC's time allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_that_leaves_calls_open_on_a_configuration_stream_loses_the_stream() {
    tokio::time::timeout(LIMIT, async {
        let (endpoint, mut opts) = bare_edge();
        // Long enough that only the bound on open calls can end the stream within the test.
        opts.rpc_timeout = Duration::from_secs(60);
        let (handle, _metrics, _registry) = start_connector(opts, token());
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let worker = LocalWorker::start("config-stream-test").unwrap();
        let _edge = serve_registration(
            &worker,
            RpcStream {
                reader: recv,
                writer: send,
            },
            Arc::new(FarAway),
        )
        .await
        .unwrap();
        handle.wait_registered(1).await;

        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&cftunnel_tunnel::stream::RPC_SIGNATURE)
            .await
            .unwrap();
        let answers = tokio::spawn(async move {
            let mut answers = 0usize;
            while let Some(msg) = read_frame(&mut recv).await {
                if let Ok(message::Return(_)) =
                    msg.get_root::<message::Reader<'_>>().unwrap().which()
                {
                    answers += 1;
                }
            }
            answers
        });
        const FLOOD: u32 = 10_000;
        for question in 0..FLOOD {
            if send.write_all(&bootstrap(question)).await.is_err() {
                break;
            }
        }
        let answered = tokio::time::timeout(Duration::from_secs(10), answers)
            .await
            .expect("the connector ended the configuration stream")
            .unwrap();
        assert!(
            answered < 100,
            "{answered} of {FLOOD} calls left open were answered"
        );
        // The stream, not the connection: it stays registered.
        assert_eq!(handle.registered(), 1);
        drop(handle);
    })
    .await
    .expect("test finished in time");
}
