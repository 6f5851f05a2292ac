//! Edge listeners: QUIC and TLS/TCP on one port, control streams.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use quinn::VarInt;
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use cftunnel_tunnel::h2io::{H2Reader, H2Writer};
use cftunnel_tunnel::liveness::Heard;
use cftunnel_tunnel::rpc::RpcStream;
use cftunnel_tunnel::stream::headers::CONNECTION_UPGRADE;

use super::rpc::serve_registration;
use super::{EdgeProtocol, Inner, MockEdgeError, Transport};
use crate::pki::TestPki;

/// Pause between a registration error going out and closing the connection, so
/// the reply reaches the connector first.
const CLOSE_AFTER_ERROR: Duration = Duration::from_millis(200);

/// Longest wait for a registration answer to be written before acting anyway.
const ANSWER_WRITE_WAIT: Duration = Duration::from_secs(5);

/// How long a connector has, from the moment its connection is accepted, to register
/// it by default. A connection with no registration by then is closed: QUIC with code
/// 0, HTTP/2 by closing the TCP connection.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the edge sends an HTTP/2 PING on a connector connection by default.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(3);

/// How long a PING may go unanswered by default, with nothing at all arriving, before
/// the edge closes the connection: the order of QUIC's 5 s idle timeout.
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest TLS handshake on the TCP listener.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for the connector's answer to the control-stream request.
const CONTROL_STREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// How a connection's `registerConnection` was answered; the connection's task acts
/// on it once the answer has gone out ([`AnswerSent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// Registered: a remotely managed tunnel's configuration follows.
    Registered,
    /// Refused: the edge closes the connection.
    Refused,
}

/// Tells a connection's task when the registration answer has been handed to the
/// transport: the registration hook arms it as it decides (the answer is written after
/// the hook returns), and the first flush of the control stream after a write that
/// followed fires it. The transport sends it from its buffer soon after; a close waits
/// [`CLOSE_AFTER_ERROR`] more for that. Acting earlier would let a configuration push
/// overtake the answer, or a close drop it.
#[derive(Default)]
pub(super) struct AnswerSent {
    /// 0 idle, 1 armed, 2 armed and written since.
    state: AtomicU8,
    sent: Notify,
}

impl AnswerSent {
    pub(super) fn arm(&self) {
        self.state.store(1, Ordering::SeqCst);
    }

    fn wrote(&self) {
        let _ = self
            .state
            .compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn flushed(&self) {
        if self
            .state
            .compare_exchange(2, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.sent.notify_one();
        }
    }
}

/// The edge's writing half of a control stream, reporting to [`AnswerSent`].
struct AnswerWriter<W> {
    inner: W,
    signal: Arc<AnswerSent>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for AnswerWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.signal.wrote();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.signal.flushed();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Pause after a failed `accept`. Failures such as running out of file descriptors
/// last until something is released, so accepting again at once would only spin.
pub(super) const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection `accept` gives, or `None` once `cancel` fires. A failed accept
/// is logged and tried again after [`ACCEPT_ERROR_BACKOFF`].
pub(super) async fn accept_next<T, F, Fut>(
    listener: &'static str,
    cancel: &CancellationToken,
    mut accept: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    loop {
        let accepted = tokio::select! {
            a = accept() => a,
            _ = cancel.cancelled() => return None,
        };
        match accepted {
            Ok(conn) => return Some(conn),
            Err(e) => {
                tracing::warn!(listener, error = %e, "accept failed; trying again shortly");
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                    _ = cancel.cancelled() => return None,
                }
            }
        }
    }
}

/// Waits until the answer has gone out (bounded: a control stream that stopped
/// taking writes must not keep the connection's task from acting).
async fn answer_written(signal: &AnswerSent) {
    let _ = tokio::time::timeout(ANSWER_WRITE_WAIT, signal.sent.notified()).await;
}

fn server_transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(1024))
        .max_concurrent_uni_streams(VarInt::from_u32(16))
        .max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(10)).ok())
        .keep_alive_interval(Some(Duration::from_secs(1)))
        .datagram_receive_buffer_size(Some(1 << 20))
        .stream_receive_window(VarInt::from_u32(6 * 1024 * 1024))
        .receive_window(VarInt::from_u32(30 * 1024 * 1024));
    t
}

/// The UDP side: a QUIC endpoint, or a bound socket that never answers.
pub(super) enum Udp {
    Quic(quinn::Endpoint),
    Silent(#[allow(dead_code)] std::net::UdpSocket),
}

/// Binds UDP and TCP on the same port number.
pub(super) fn bind(
    addr: SocketAddr,
    pki: &TestPki,
    provider: Arc<rustls::crypto::CryptoProvider>,
    quic: bool,
) -> Result<(Udp, std::net::TcpListener), MockEdgeError> {
    let mut server = pki.quic_server(provider)?;
    server.transport_config(Arc::new(server_transport()));
    let mut last_err = None;
    for _ in 0..16 {
        let udp = std::net::UdpSocket::bind(addr)?;
        let port = udp.local_addr()?.port();
        match std::net::TcpListener::bind(SocketAddr::new(addr.ip(), port)) {
            Ok(tcp) => {
                tcp.set_nonblocking(true)?;
                udp.set_nonblocking(true)?;
                if !quic {
                    return Ok((Udp::Silent(udp), tcp));
                }
                let endpoint = cftunnel_tunnel::udp::endpoint(
                    quinn::EndpointConfig::default(),
                    Some(server.clone()),
                    udp,
                )?;
                return Ok((Udp::Quic(endpoint), tcp));
            }
            Err(e) if addr.port() == 0 => last_err = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last_err
        .unwrap_or_else(|| std::io::Error::other("no free port"))
        .into())
}

pub(super) fn spawn_quic(inner: &Arc<Inner>, endpoint: quinn::Endpoint) {
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        loop {
            let incoming = tokio::select! {
                i = endpoint.accept() => i,
                _ = inner2.cancel.cancelled() => return,
            };
            let Some(incoming) = incoming else { return };
            let inner3 = inner2.clone();
            inner2.tasks.spawn(async move {
                if let Err(e) = serve_quic(&inner3, incoming).await {
                    tracing::debug!(error = %e, "mock edge quic connection ended");
                }
            });
        }
    });
}

async fn serve_quic(inner: &Arc<Inner>, incoming: quinn::Incoming) -> Result<(), MockEdgeError> {
    let deadline = Instant::now() + inner.registration_timeout;
    let conn = tokio::time::timeout_at(deadline, incoming)
        .await
        .map_err(|_| {
            MockEdgeError::Stream("no QUIC handshake before the registration deadline".into())
        })?
        .map_err(|e| MockEdgeError::Stream(e.to_string()))?;
    let group = quic_key_exchange_group(&conn);
    let (id, close) =
        inner.add_connection(Transport::Quic(conn.clone()), EdgeProtocol::Quic, group);
    // As the edge closes a connection: code 0, no reason.
    let close_conn = || conn.close(VarInt::from_u32(0), b"");
    let result = async {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => s.map_err(|e| MockEdgeError::Stream(e.to_string()))?,
            _ = close.cancelled() => {
                close_conn();
                return Ok(());
            }
            () = tokio::time::sleep_until(deadline) => {
                not_registered_in_time(inner, id);
                close_conn();
                return Ok(());
            }
        };
        let (answered_tx, mut answered_rx) = mpsc::channel(1);
        let signal = Arc::new(AnswerSent::default());
        let _session = serve_registration(
            &inner.worker,
            RpcStream {
                reader: recv,
                writer: AnswerWriter {
                    inner: send,
                    signal: signal.clone(),
                },
            },
            inner.hooks(id, answered_tx, signal.clone()),
        )
        .await?;
        let mut registered = false;
        loop {
            tokio::select! {
                _ = conn.closed() => break,
                Some(answer) = answered_rx.recv() => {
                    registered |= answer == Answered::Registered;
                    tokio::select! {
                        () = answer_written(&signal) => {}
                        _ = conn.closed() => break,
                        _ = close.cancelled() => {
                            close_conn();
                            break;
                        }
                    }
                    if answer == Answered::Refused {
                        tokio::time::sleep(CLOSE_AFTER_ERROR).await;
                        close_conn();
                        break;
                    }
                    inner.send_current_config(id);
                }
                () = tokio::time::sleep_until(deadline), if !registered => {
                    // The answer may be on its way (the hook has run, its notice not yet read).
                    registered = inner.is_registered(id);
                    if !registered {
                        not_registered_in_time(inner, id);
                        close_conn();
                        break;
                    }
                }
                _ = close.cancelled() => {
                    close_conn();
                    break;
                }
            }
        }
        Ok(())
    }
    .await;
    inner.remove_connection(id);
    result
}

fn not_registered_in_time(inner: &Inner, id: u64) {
    tracing::info!(
        conn = id,
        deadline = ?inner.registration_timeout,
        "no registration in time; closing the connection"
    );
}

/// The key-exchange group of an established QUIC connection's handshake.
fn quic_key_exchange_group(conn: &quinn::Connection) -> Option<rustls::NamedGroup> {
    conn.handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()
        .map(|h| h.negotiated_key_exchange_group)
}

pub(super) fn spawn_tcp(
    inner: &Arc<Inner>,
    listener: std::net::TcpListener,
    pki: &TestPki,
    provider: Arc<rustls::crypto::CryptoProvider>,
    http2: bool,
) -> Result<(), MockEdgeError> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.tcp_server(provider)?));
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        loop {
            let accepted = accept_next("edge tcp", &inner2.cancel, || listener.accept()).await;
            let Some((tcp, _)) = accepted else { return };
            if !http2 {
                drop(tcp);
                continue;
            }
            let _ = tcp.set_nodelay(true);
            if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&tcp_keepalive()) {
                tracing::debug!(error = %e, "tcp keep-alive not set");
            }
            let inner3 = inner2.clone();
            let acceptor = acceptor.clone();
            inner2.tasks.spawn(async move {
                if let Err(e) = serve_tcp(&inner3, acceptor, tcp).await {
                    tracing::debug!(error = %e, "mock edge http2 connection ended");
                }
            });
        }
    });
    Ok(())
}

/// Accepts TCP connections and holds them open, answering nothing, until the edge shuts down
/// (see [`MockEdgeBuilder::silent_http2`](super::MockEdgeBuilder::silent_http2)).
pub(super) fn spawn_silent_tcp(
    inner: &Arc<Inner>,
    listener: std::net::TcpListener,
) -> Result<(), MockEdgeError> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        let mut held = Vec::new();
        while let Some((tcp, _)) =
            accept_next("edge tcp", &inner2.cancel, || listener.accept()).await
        {
            held.push(tcp);
        }
    });
    Ok(())
}

async fn serve_tcp(
    inner: &Arc<Inner>,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
) -> Result<(), MockEdgeError> {
    let deadline = Instant::now() + inner.registration_timeout;
    let stream_err = |e: &dyn std::fmt::Display| MockEdgeError::Stream(e.to_string());
    let tls = tokio::time::timeout_at(
        deadline.min(Instant::now() + TLS_HANDSHAKE_TIMEOUT),
        acceptor.accept(tcp),
    )
    .await
    .map_err(|e| stream_err(&e))??;
    let group = tls
        .get_ref()
        .1
        .negotiated_key_exchange_group()
        .map(|g| g.name());
    // Every byte read counts as a sign of life for the PINGs below.
    let (tls, read) = Heard::new(tls);
    // The edge is the HTTP/2 client on this connection.
    let (send_request, mut connection) = h2::client::Builder::new()
        .initial_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(16 * 1024 * 1024)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|e| stream_err(&e))?;
    let silent = cftunnel_tunnel::liveness::silent(
        connection.ping_pong(),
        read,
        inner.h2_ping_interval,
        inner.h2_ping_timeout,
    );
    let mut driver = tokio::spawn(connection);
    let (id, close) = inner.add_connection(
        Transport::H2(send_request.clone()),
        EdgeProtocol::Http2,
        group,
    );
    let serve = async {
        let control = async {
            let req = http::Request::builder()
                .method(http::Method::GET)
                .uri("https://h2.cftunnel.com/")
                .header(CONNECTION_UPGRADE, "control-stream")
                .body(())
                .map_err(|e| stream_err(&e))?;
            let mut ready = send_request
                .clone()
                .ready()
                .await
                .map_err(|e| stream_err(&e))?;
            let (resp, send) = ready.send_request(req, false).map_err(|e| stream_err(&e))?;
            let resp = tokio::time::timeout(CONTROL_STREAM_TIMEOUT, resp)
                .await
                .map_err(|e| stream_err(&e))?
                .map_err(|e| stream_err(&e))?;
            if resp.status() != http::StatusCode::OK {
                return Err(MockEdgeError::Stream(format!(
                    "control stream answered {}",
                    resp.status()
                )));
            }
            Ok((resp, send))
        };
        let (resp, send) = tokio::select! {
            r = control => r?,
            _ = &mut driver => return Ok(()),
            _ = close.cancelled() => return Ok(()),
            () = tokio::time::sleep_until(deadline) => {
                not_registered_in_time(inner, id);
                return Ok(());
            }
        };
        let (answered_tx, mut answered_rx) = mpsc::channel(1);
        let signal = Arc::new(AnswerSent::default());
        let _session = serve_registration(
            &inner.worker,
            RpcStream {
                reader: H2Reader::new(resp.into_body()),
                writer: AnswerWriter {
                    inner: H2Writer::new(send),
                    signal: signal.clone(),
                },
            },
            inner.hooks(id, answered_tx, signal.clone()),
        )
        .await?;
        let mut registered = false;
        loop {
            tokio::select! {
                _ = &mut driver => break,
                Some(answer) = answered_rx.recv() => {
                    registered |= answer == Answered::Registered;
                    tokio::select! {
                        () = answer_written(&signal) => {}
                        _ = &mut driver => break,
                        _ = close.cancelled() => break,
                    }
                    if answer == Answered::Refused {
                        // After a registration error the edge closes the connection
                        // (cloudflared waits for that).
                        tokio::time::sleep(CLOSE_AFTER_ERROR).await;
                        break;
                    }
                    inner.send_current_config(id);
                }
                () = tokio::time::sleep_until(deadline), if !registered => {
                    registered = inner.is_registered(id);
                    if !registered {
                        not_registered_in_time(inner, id);
                        break;
                    }
                }
                _ = close.cancelled() => break,
            }
        }
        Ok(())
    };
    // Closing is dropping the HTTP/2 connection, which closes the TCP connection.
    let result = tokio::select! {
        r = serve => r,
        () = silent => {
            tracing::warn!(
                conn = id,
                timeout = ?inner.h2_ping_timeout,
                "connector sent nothing in answer to an HTTP/2 PING; closing the connection"
            );
            Ok(())
        }
    };
    inner.remove_connection(id);
    driver.abort();
    result
}

/// TCP keep-alive on connector connections, as Go's listener and dialer set it: the
/// first probe after 15 s of silence, then every 15 s, 9 unanswered probes end the
/// connection. It notices a vanished peer even with the HTTP/2 PINGs switched off.
fn tcp_keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(15))
        .with_interval(Duration::from_secs(15))
        .with_retries(9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn accept_errors_are_retried_after_a_pause() {
        let cancel = CancellationToken::new();
        let calls = AtomicUsize::new(0);
        let failing = || {
            calls.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Err::<(), _>(std::io::Error::other("too many open files")))
        };
        let waited = Duration::from_millis(350);
        let accepted = tokio::time::timeout(waited, accept_next("test", &cancel, failing)).await;
        assert!(accepted.is_err(), "nothing was accepted");
        let calls = calls.load(Ordering::Relaxed);
        // One attempt, then one per pause (a loaded machine may fit in fewer): a loop
        // that tried again at once would make thousands.
        assert!((2..=5).contains(&calls), "{calls} attempts in {waited:?}");

        // Success after failures; cancellation ends the wait.
        let mut left = 2;
        let flaky = || {
            left -= 1;
            std::future::ready(if left >= 0 {
                Err(std::io::Error::other("again"))
            } else {
                Ok(7)
            })
        };
        assert_eq!(accept_next("test", &cancel, flaky).await, Some(7));
        cancel.cancel();
        let never = || std::future::pending::<std::io::Result<()>>();
        assert_eq!(accept_next("test", &cancel, never).await, None);
    }
}
