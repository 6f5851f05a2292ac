//! Request bodies and upgraded streams handed to the service.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::h2io::H2Io;
use crate::tasks::InFlight;

const READ_CHUNK: usize = 32 * 1024;

/// Boxed error type used at the service boundary.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Streaming request body of a tunnelled request.
///
/// Data is read from the edge stream as the service polls it, so the edge
/// is flow-controlled by the service (backpressure); nothing is buffered
/// beyond one read chunk.
pub struct Body {
    kind: Kind,
}

enum Kind {
    Empty,
    Quic {
        recv: quinn::RecvStream,
        remaining: Option<u64>,
        buf: BytesMut,
        /// Where the stream goes when the body is dropped unread, so the stream
        /// task stops it once the response is out (see [`Body::quic_request`]).
        handback: Option<oneshot::Sender<quinn::RecvStream>>,
    },
    H2 {
        recv: h2::RecvStream,
        data_done: bool,
        /// Bytes still to come, when the request stated its length (h2 refuses a body that
        /// does not match it).
        remaining: Option<u64>,
    },
}

/// Errors while reading a request body.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The edge reset or the connection failed mid-body.
    #[error("request body stream failed: {0}")]
    Stream(String),
    /// The edge sent more bytes than `Content-Length` announced.
    #[error("request body longer than its content-length")]
    TooLong,
    /// The edge ended the stream before the bytes `Content-Length` announced:
    /// a cut-off body, not a complete one.
    #[error("request body ended {missing} bytes short of its content-length")]
    TooShort {
        /// Bytes still owed when the stream ended.
        missing: u64,
    },
}

impl Body {
    /// An empty body.
    pub fn empty() -> Self {
        Self { kind: Kind::Empty }
    }

    /// A body read from a QUIC stream, `content_length` bytes long when known; dropped
    /// unfinished, the stream is stopped at once. For the edge's side: a response body as
    /// a connector sends it.
    pub fn quic(recv: quinn::RecvStream, content_length: Option<u64>) -> Self {
        Self::quic_with_handback(recv, content_length, None)
    }

    /// A request body read from a QUIC stream. Dropped before the edge finished
    /// sending it, it hands the stream to `handback` instead of letting quinn
    /// send STOP_SENDING at once: `cloudflared` stops reading a request only
    /// after its response, so the edge never sees a request cancelled before
    /// the answer to it.
    pub(crate) fn quic_request(
        recv: quinn::RecvStream,
        content_length: Option<u64>,
        handback: oneshot::Sender<quinn::RecvStream>,
    ) -> Self {
        Self::quic_with_handback(recv, content_length, Some(handback))
    }

    fn quic_with_handback(
        recv: quinn::RecvStream,
        content_length: Option<u64>,
        handback: Option<oneshot::Sender<quinn::RecvStream>>,
    ) -> Self {
        Self {
            kind: Kind::Quic {
                recv,
                remaining: content_length,
                buf: BytesMut::new(),
                handback,
            },
        }
    }

    /// A body read from an h2 stream, trailers included. For the edge's side: a response
    /// body as a connector sends it over HTTP/2.
    pub fn h2(recv: h2::RecvStream) -> Self {
        Self::h2_request(recv, None)
    }

    /// A request body read from an h2 stream, `content_length` bytes long when the request
    /// says so: its size is then known to the service, as over QUIC.
    pub(crate) fn h2_request(recv: h2::RecvStream, content_length: Option<u64>) -> Self {
        let data_done = recv.is_end_stream();
        Self {
            kind: Kind::H2 {
                recv,
                data_done,
                remaining: content_length,
            },
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Kind::Quic { handback, .. } = &mut self.kind {
            if let Some(tx) = handback.take() {
                if let Kind::Quic { recv, .. } = std::mem::replace(&mut self.kind, Kind::Empty) {
                    // If the stream task has ended already, the send fails and dropping
                    // the stream stops it.
                    let _ = tx.send(recv);
                }
            }
        }
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Empty => "empty",
            Kind::Quic { .. } => "quic",
            Kind::H2 { .. } => "h2",
        };
        f.debug_struct("Body").field("kind", &kind).finish()
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Quic {
                recv,
                remaining,
                buf,
                ..
            } => {
                if *remaining == Some(0) {
                    return Poll::Ready(None);
                }
                if buf.capacity() < READ_CHUNK {
                    buf.reserve(READ_CHUNK);
                }
                let n = ready!(tokio_util::io::poll_read_buf(Pin::new(recv), cx, buf))
                    .map_err(|e| BodyError::Stream(e.to_string()))?;
                if n == 0 {
                    return Poll::Ready(
                        remaining.map(|missing| Err(BodyError::TooShort { missing })),
                    );
                }
                if let Some(rem) = remaining {
                    *rem = rem.checked_sub(n as u64).ok_or(BodyError::TooLong)?;
                }
                Poll::Ready(Some(Ok(Frame::data(buf.split().freeze()))))
            }
            Kind::H2 {
                recv,
                data_done,
                remaining,
            } => {
                while !*data_done {
                    match ready!(recv.poll_data(cx)) {
                        // Empty frames (an END_STREAM marker) carry nothing.
                        Some(Ok(data)) if data.is_empty() => {}
                        Some(Ok(data)) => {
                            let _ = recv.flow_control().release_capacity(data.len());
                            if let Some(rem) = remaining {
                                *rem = rem.saturating_sub(data.len() as u64);
                            }
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        Some(Err(e)) => {
                            return Poll::Ready(Some(Err(BodyError::Stream(e.to_string()))))
                        }
                        None => *data_done = true,
                    }
                }
                match ready!(recv.poll_trailers(cx)) {
                    Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                    Ok(None) => Poll::Ready(None),
                    Err(e) => Poll::Ready(Some(Err(BodyError::Stream(e.to_string())))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Quic { remaining, .. } => *remaining == Some(0),
            Kind::H2 {
                recv, data_done, ..
            } => *data_done && recv.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Quic {
                remaining: Some(n), ..
            }
            | Kind::H2 {
                remaining: Some(n), ..
            } => SizeHint::with_exact(*n),
            _ => SizeHint::default(),
        }
    }
}

/// The raw byte stream of a WebSocket (or other upgraded) exchange after the
/// service answered `101 Switching Protocols`.
pub struct Upgraded {
    kind: UpgradedKind,
    _in_flight: Option<InFlight>,
}

enum UpgradedKind {
    Quic {
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    },
    H2(H2Io),
}

impl Upgraded {
    /// The byte stream of an upgraded exchange over a QUIC stream. For the edge's side of a
    /// WebSocket or TCP stream.
    pub fn quic(send: quinn::SendStream, recv: quinn::RecvStream) -> Self {
        Self {
            kind: UpgradedKind::Quic { send, recv },
            _in_flight: None,
        }
    }

    /// The byte stream of an upgraded exchange over an h2 stream. For the edge's side of a
    /// WebSocket or TCP stream.
    pub fn h2(io: H2Io) -> Self {
        Self {
            kind: UpgradedKind::H2(io),
            _in_flight: None,
        }
    }

    /// Keeps the request stream counted as in flight until this connection is dropped.
    pub(crate) fn counted(mut self, in_flight: InFlight) -> Self {
        self._in_flight = Some(in_flight);
        self
    }
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded").finish_non_exhaustive()
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.kind {
            UpgradedKind::Quic { recv, .. } => AsyncRead::poll_read(Pin::new(recv), cx, buf),
            UpgradedKind::H2(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.kind {
            UpgradedKind::Quic { send, .. } => AsyncWrite::poll_write(Pin::new(send), cx, buf),
            UpgradedKind::H2(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.kind {
            UpgradedKind::Quic { send, .. } => Pin::new(send).poll_flush(cx),
            UpgradedKind::H2(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.kind {
            UpgradedKind::Quic { send, .. } => Pin::new(send).poll_shutdown(cx),
            UpgradedKind::H2(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// Request extension present on WebSocket requests. Resolves to the
/// [`Upgraded`] stream once the service's `101` response head has been sent
/// to the edge; fails if the service answered anything else.
#[derive(Clone)]
pub struct OnUpgrade {
    rx: Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>,
}

/// The request was not upgraded (the response was not `101`, or the stream
/// closed first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request was not upgraded")]
pub struct UpgradeError;

impl OnUpgrade {
    pub(crate) fn pair() -> (oneshot::Sender<Upgraded>, Self) {
        let (tx, rx) = oneshot::channel();
        (
            tx,
            Self {
                rx: Arc::new(Mutex::new(Some(rx))),
            },
        )
    }
}

impl std::fmt::Debug for OnUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnUpgrade").finish_non_exhaustive()
    }
}

impl Future for OnUpgrade {
    type Output = Result<Upgraded, UpgradeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(mut guard) = self.rx.lock() else {
            return Poll::Ready(Err(UpgradeError));
        };
        let Some(rx) = guard.as_mut() else {
            return Poll::Ready(Err(UpgradeError));
        };
        let res = ready!(Pin::new(rx).poll(cx));
        *guard = None;
        Poll::Ready(res.map_err(|_| UpgradeError))
    }
}
