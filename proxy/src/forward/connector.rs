//! Dials one fixed backend, whatever the request URI says, optionally over TLS.

use super::tls::TlsTarget;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectErrorKind {
    Dial,
    Timeout,
    Tls,
}

/// A failed dial, with enough detail for the metrics reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?} {target}: {message}")]
pub struct ConnectError {
    pub kind: ConnectErrorKind,
    pub target: Arc<str>,
    pub message: String,
}

#[derive(Debug)]
struct Target {
    host: Box<str>,
    port: u16,
    label: Arc<str>,
    tls: Option<TlsTarget>,
    timeout: Duration,
}

#[derive(Debug, Clone)]
pub(crate) struct Connector {
    target: Arc<Target>,
}

impl Connector {
    pub(crate) fn new(host: &str, port: u16, tls: Option<TlsTarget>, timeout: Duration) -> Self {
        Self {
            target: Arc::new(Target {
                host: host.into(),
                port,
                label: format!("{host}:{port}").into(),
                tls,
                timeout,
            }),
        }
    }
}

impl Connector {
    /// Dials the backend (and completes the TLS handshake, if any).
    pub(crate) async fn connect(&self) -> Result<Stream, ConnectError> {
        connect(&self.target).await
    }
}

async fn connect(t: &Target) -> Result<Stream, ConnectError> {
    let err = |kind, message: String| ConnectError {
        kind,
        target: t.label.clone(),
        message,
    };
    let dial = TcpStream::connect((&*t.host, t.port));
    let tcp = tokio::time::timeout(t.timeout, dial)
        .await
        .map_err(|_| err(ConnectErrorKind::Timeout, "connect timed out".into()))?
        .map_err(|e| err(ConnectErrorKind::Dial, e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &t.tls else {
        return Ok(Stream::Plain(tcp));
    };
    let handshake = tls.connector().connect(tls.server_name().clone(), tcp);
    let stream = tokio::time::timeout(t.timeout, handshake)
        .await
        .map_err(|_| err(ConnectErrorKind::Timeout, "TLS handshake timed out".into()))?
        .map_err(|e| err(ConnectErrorKind::Tls, e.to_string()))?;
    Ok(Stream::Tls(Box::new(stream)))
}

/// A backend connection, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Whether the backend picked `h2` through ALPN.
    pub(crate) fn negotiated_h2(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }
}
