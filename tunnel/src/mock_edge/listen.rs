//! Edge listeners: QUIC and TLS/TCP on one port, control streams.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::VarInt;
use tokio::sync::mpsc;

use super::{EdgeProtocol, Inner, MockEdgeError, Transport};
use crate::h2io::{H2Reader, H2Writer};
use crate::rpc::edge::serve_registration;
use crate::rpc::RpcStream;
use crate::stream::headers::CONNECTION_UPGRADE;
use crate::tls::TestPki;

/// Pause between a registration error and closing the connection, so the
/// reply reaches the connector first.
const CLOSE_AFTER_ERROR: Duration = Duration::from_millis(200);

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
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(pki.quic_server(provider)?)
        .map_err(|e| crate::tls::TlsError::Config(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
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
                let endpoint = crate::udp::endpoint(
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
    let conn = incoming
        .await
        .map_err(|e| MockEdgeError::Stream(e.to_string()))?;
    let group = quic_key_exchange_group(&conn);
    let (id, close) =
        inner.add_connection(Transport::Quic(conn.clone()), EdgeProtocol::Quic, group);
    let result = async {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => s.map_err(|e| MockEdgeError::Stream(e.to_string()))?,
            _ = close.cancelled() => {
                conn.close(VarInt::from_u32(0), b"");
                return Ok(());
            }
        };
        let (close_tx, mut close_rx) = mpsc::channel(1);
        let _session = serve_registration(
            &inner.worker,
            RpcStream {
                reader: recv,
                writer: send,
            },
            inner.hooks(id, close_tx),
        )
        .await?;
        tokio::select! {
            _ = conn.closed() => {}
            Some(()) = close_rx.recv() => {
                tokio::time::sleep(CLOSE_AFTER_ERROR).await;
                conn.close(VarInt::from_u32(0), b"registration refused");
            }
            _ = close.cancelled() => conn.close(VarInt::from_u32(0), b""),
        }
        Ok(())
    }
    .await;
    inner.remove_connection(id);
    result
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
) -> Result<(), MockEdgeError> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.tcp_server(provider)?));
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = inner2.cancel.cancelled() => return,
            };
            let Ok((tcp, _)) = accepted else { continue };
            let _ = tcp.set_nodelay(true);
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

async fn serve_tcp(
    inner: &Arc<Inner>,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
) -> Result<(), MockEdgeError> {
    let stream_err = |e: &dyn std::fmt::Display| MockEdgeError::Stream(e.to_string());
    let tls = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
        .await
        .map_err(|e| stream_err(&e))??;
    let group = tls
        .get_ref()
        .1
        .negotiated_key_exchange_group()
        .map(|g| g.name());
    // The edge is the HTTP/2 client on this connection.
    let (send_request, connection) = h2::client::Builder::new()
        .initial_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(16 * 1024 * 1024)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|e| stream_err(&e))?;
    let mut driver = tokio::spawn(connection);
    let (id, close) = inner.add_connection(
        Transport::H2(send_request.clone()),
        EdgeProtocol::Http2,
        group,
    );
    let result = async {
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
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .map_err(|e| stream_err(&e))?
            .map_err(|e| stream_err(&e))?;
        if resp.status() != http::StatusCode::OK {
            return Err(MockEdgeError::Stream(format!(
                "control stream answered {}",
                resp.status()
            )));
        }
        let (close_tx, mut close_rx) = mpsc::channel(1);
        let _session = serve_registration(
            &inner.worker,
            RpcStream {
                reader: H2Reader::new(resp.into_body()),
                writer: H2Writer::new(send),
            },
            inner.hooks(id, close_tx),
        )
        .await?;
        tokio::select! {
            _ = &mut driver => {}
            Some(()) = close_rx.recv() => {
                // After a registration error the edge closes the connection.
                tokio::time::sleep(CLOSE_AFTER_ERROR).await;
            }
            _ = close.cancelled() => {}
        }
        Ok(())
    }
    .await;
    inner.remove_connection(id);
    driver.abort();
    result
}
