//! Connector side of edge-opened RPC streams: serves `CloudflaredServer`
//! (configuration pushes; datagram v2 sessions are refused because the
//! connector does not advertise them).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::RpcSystem;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::calls::Questioned;
use super::{LocalWorker, RpcError, RpcStream};
use crate::tunnelrpc_capnp::{cloudflared_server, configuration_manager, session_manager};

/// The latest configuration the edge pushed and this connector applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Version; `-1` until the first push.
    pub version: i32,
    /// The JSON document exactly as pushed.
    pub config: Bytes,
}

/// Shared version state: a push applies only when newer than the current one.
#[derive(Debug)]
pub(crate) struct RemoteConfigState {
    tx: watch::Sender<RemoteConfig>,
    /// `cftunnel_tunnel_remote_config_version`, set as a push is applied, whichever
    /// transport carried it.
    version_gauge: Gauge,
}

impl RemoteConfigState {
    pub(crate) fn new(version_gauge: Gauge) -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(RemoteConfig {
                version: -1,
                config: Bytes::new(),
            }),
            version_gauge,
        })
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<RemoteConfig> {
        self.tx.subscribe()
    }

    /// Applies a push; returns the latest applied version and an error text.
    ///
    /// Pushes on different connections are applied from different threads
    /// (the RPC worker for QUIC, runtime workers for HTTP/2), so the version
    /// is compared and replaced under the watch channel's lock: an older push
    /// finishing late can never replace a newer one.
    pub(crate) fn apply(&self, version: i32, config: &[u8]) -> (i32, Option<String>) {
        let current = self.tx.borrow().version;
        if version <= current {
            return (current, None);
        }
        // Validated and copied before taking the lock, which blocks readers.
        if let Err(e) = check(config) {
            return (current, Some(e));
        }
        let next = RemoteConfig {
            version,
            config: Bytes::copy_from_slice(config),
        };
        let mut latest = version;
        let applied = self.tx.send_if_modified(|cur| {
            if version <= cur.version {
                latest = cur.version;
                return false;
            }
            *cur = next;
            // Set under the lock too, so the metric ends on the applied version.
            self.version_gauge.set(version.into());
            true
        });
        if applied {
            tracing::info!(version, "updated to new remote configuration");
        }
        (latest, None)
    }
}

/// Checks that `config` is what `cloudflared` decodes into its configuration struct: an
/// object, or `null` (which Go decodes as leaving it empty); the error text otherwise.
///
/// The document is parsed as a tree of values would be, with the same errors, but no tree
/// is built: a push of up to 8 MiB of small values would take twenty times that as one.
fn check(config: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<Checked>(config).map_err(|e| format!("invalid configuration: {e}"))?;
    // Valid JSON: its first character says what it is.
    match config
        .iter()
        .find(|b| !matches!(b, b' ' | b'\n' | b'\t' | b'\r'))
    {
        Some(b'{' | b'n') => Ok(()),
        _ => Err("invalid configuration: not a JSON object".to_owned()),
    }
}

/// Any JSON value, decoded as `serde_json::Value` decodes one (each string, number and
/// nesting checked alike) and dropped as it goes.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked)
    }
}

impl<'de> serde::de::Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

struct Server {
    state: Arc<RemoteConfigState>,
}

impl session_manager::Server for Server {
    async fn register_udp_session(
        self: capnp::capability::Rc<Self>,
        _: session_manager::RegisterUdpSessionParams,
        mut results: session_manager::RegisterUdpSessionResults,
    ) -> Result<(), capnp::Error> {
        results
            .get()
            .init_result()
            .set_err("datagram sessions are not supported by this connector");
        Ok(())
    }

    async fn unregister_udp_session(
        self: capnp::capability::Rc<Self>,
        _: session_manager::UnregisterUdpSessionParams,
        _: session_manager::UnregisterUdpSessionResults,
    ) -> Result<(), capnp::Error> {
        Ok(())
    }
}

impl configuration_manager::Server for Server {
    async fn update_configuration(
        self: capnp::capability::Rc<Self>,
        params: configuration_manager::UpdateConfigurationParams,
        mut results: configuration_manager::UpdateConfigurationResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let (version, config) = (p.get_version(), p.get_config()?.to_vec());
        // Checking a document of up to 8 MiB takes milliseconds, which this thread, serving
        // every connection's control stream, is not held for.
        let state = Arc::clone(&self.state);
        let (latest, err) = tokio::task::spawn_blocking(move || state.apply(version, &config))
            .await
            .map_err(|e| capnp::Error::failed(format!("applying the configuration: {e}")))?;
        let mut r = results.get().init_result();
        r.set_latest_applied_version(latest);
        r.set_err(err.as_deref().unwrap_or(""));
        Ok(())
    }
}

impl cloudflared_server::Server for Server {}

/// Serves one edge RPC session until the edge ends it or `timeout` passes.
pub(crate) async fn serve<R, W>(
    worker: &LocalWorker,
    stream: RpcStream<R, W>,
    state: Arc<RemoteConfigState>,
    timeout: Duration,
) -> Result<(), RpcError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    worker
        .spawn(move || async move {
            let client: cloudflared_server::Client = capnp_rpc::new_client(Server { state });
            let rpc = RpcSystem::new(
                Box::new(Questioned::new(
                    stream.gated_network(Side::Server),
                    "a configuration stream",
                )),
                Some(client.client),
            );
            let res = match tokio::time::timeout(timeout, rpc).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(RpcError::from(e)),
                Err(_) => Err(RpcError::Timeout),
            };
            let _ = done_tx.send(res);
        })
        .await?;
    done_rx.await.map_err(|_| RpcError::WorkerGone)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_apply_only_when_newer_and_valid() {
        let s = RemoteConfigState::new(Gauge::default());
        assert_eq!(s.apply(3, br#"{"ingress":[]}"#), (3, None));
        assert_eq!(
            s.version_gauge.get(),
            3,
            "the metric follows the applied version"
        );
        assert_eq!(s.apply(2, b"{}"), (3, None));
        // What Go cannot decode into its configuration struct is refused.
        for refused in [&b"not json"[..], b"[]", b"1", b"\"x\"", b""] {
            let (v, err) = s.apply(4, refused);
            assert_eq!(v, 3);
            assert!(err.is_some(), "{}", String::from_utf8_lossy(refused));
        }
        assert_eq!(s.subscribe().borrow().version, 3);
        // `null` decodes as an empty configuration, as in Go.
        assert_eq!(s.apply(5, b"null"), (5, None));
    }

    /// The check without a tree accepts and refuses what decoding a `serde_json::Value`
    /// did, with the same error texts.
    #[test]
    fn documents_are_checked_as_a_value_tree_checks_them() {
        fn as_tree(config: &[u8]) -> Result<(), String> {
            match serde_json::from_slice::<serde_json::Value>(config) {
                Ok(serde_json::Value::Object(_) | serde_json::Value::Null) => Ok(()),
                Ok(_) => Err("invalid configuration: not a JSON object".to_owned()),
                Err(e) => Err(format!("invalid configuration: {e}")),
            }
        }
        let deep_array = "[".repeat(200) + &"]".repeat(200);
        let deep_object = r#"{"a":"#.repeat(200) + "1" + &"}".repeat(200);
        let docs: Vec<&[u8]> = vec![
            b"{}",
            b" \r\n\t{\"ingress\":[{\"service\":\"http_status:404\"}]} \n",
            b"null",
            b"  null",
            br#"{"a":{"b":[1,-2,3.5,1e300,18446744073709551616,true,false,null,"\u00e9\n"]}}"#,
            br#"{"a":1,"a":2}"#,
            b"[]",
            b"[1,2]",
            b"1",
            b"-0.5",
            b"\"x\"",
            b"true",
            b"",
            b"   ",
            b"not json",
            b"nul",
            b"{",
            b"{\"a\"",
            b"{\"a\":}",
            b"{\"a\":1,}",
            b"{1:2}",
            b"{\"a\" 1}",
            b"[1,]",
            b"[1 2]",
            b"{} x",
            b"{}{}",
            b"01",
            b"-",
            b"1.",
            b"1e",
            b"{\"a\":1e400}",
            b"{\"a\":-1e400}",
            b"{\"a\":\"\\ud800\"}",
            b"{\"a\":\"\\udc00x\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\\u12\"}",
            b"{\"a\":\"\xff\"}",
            b"{\"\xc3\":1}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":\"unterminated",
            b"\xef\xbb\xbf{}",
            deep_array.as_bytes(),
            deep_object.as_bytes(),
        ];
        for doc in docs {
            assert_eq!(check(doc), as_tree(doc), "{}", String::from_utf8_lossy(doc));
        }
    }

    #[test]
    fn concurrent_pushes_leave_the_highest_version() {
        const THREADS: i32 = 8;
        // A document large enough that validating it takes a while.
        let rules: Vec<String> = (0..200)
            .map(|i| {
                format!(r#"{{"hostname":"h{i}.example.com","service":"http://127.0.0.1:{i}"}}"#)
            })
            .collect();
        let config = format!(r#"{{"ingress":[{}]}}"#, rules.join(","));
        for round in 0..200 {
            let s = RemoteConfigState::new(Gauge::default());
            let barrier = std::sync::Barrier::new(THREADS as usize);
            std::thread::scope(|scope| {
                for v in 1..=THREADS {
                    let (s, barrier, config) = (&s, &barrier, config.as_bytes());
                    scope.spawn(move || {
                        barrier.wait();
                        let (latest, err) = s.apply(v, config);
                        assert!(err.is_none());
                        assert!(latest >= v, "acknowledged {latest} for a push of {v}");
                    });
                }
            });
            assert_eq!(s.subscribe().borrow().version, THREADS, "round {round}");
            assert_eq!(s.version_gauge.get(), i64::from(THREADS), "round {round}");
        }
    }

    /// An edge that sends calls and never reads the answers is stopped by its own
    /// stream's flow control, instead of having the connector read every call and keep
    /// every answer in memory.
    #[tokio::test]
    async fn an_edge_that_stops_reading_stops_being_read() {
        use tokio::io::AsyncWriteExt as _;
        let worker = LocalWorker::start("rpc-flood-test").expect("worker thread");
        let (ours, peer) = tokio::io::duplex(16 * 1024);
        let (reader, writer) = tokio::io::split(ours);
        let state = RemoteConfigState::new(Gauge::default());
        let session = tokio::spawn(async move {
            serve(
                &worker,
                RpcStream { reader, writer },
                state,
                Duration::from_secs(10),
            )
            .await
        });
        let (mut answers, mut peer) = tokio::io::split(peer);
        // Each call finished at once, as an edge does, so that only the answers pile up.
        let bootstrap = |id: u32| {
            let mut m = capnp::message::Builder::new_default();
            m.init_root::<capnp_rpc::rpc_capnp::message::Builder>()
                .init_bootstrap()
                .set_question_id(id);
            let mut words = capnp::serialize::write_message_to_words(&m);
            let mut m = capnp::message::Builder::new_default();
            m.init_root::<capnp_rpc::rpc_capnp::message::Builder>()
                .init_finish()
                .set_question_id(id);
            words.extend(capnp::serialize::write_message_to_words(&m));
            words
        };
        // The flood runs as a task of its own, so that it stops inside a write, never
        // between the halves of a message.
        let sent = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let flood = tokio::spawn({
            let sent = sent.clone();
            async move {
                for id in 0..20_000u32 {
                    peer.write_all(&bootstrap(id)).await?;
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                std::io::Result::Ok(())
            }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stalled_at = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            !flood.is_finished(),
            "all {stalled_at} calls were read while none of their answers was"
        );
        // Two 16 KiB pipes' worth: the answers that filled ours, the calls that filled the
        // edge's (one pipe alone holds about 170 calls with their finishes).
        assert!(
            stalled_at > 250 && stalled_at < 5_000,
            "{stalled_at} calls read"
        );

        // Once the edge reads its answers, the connector reads its calls again.
        let drain = tokio::spawn(async move {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut answers, &mut sink).await;
        });
        tokio::time::timeout(Duration::from_secs(10), flood)
            .await
            .expect("the connector reads again once its answers are read")
            .expect("the flood task")
            .expect("the session stays up");
        drain.abort();
        session.abort();
    }
}
