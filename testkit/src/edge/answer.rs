//! A connector's answer to a plain HTTP request on a QUIC stream, read as quinn hands the
//! stream's bytes over: the data signature, version and `ConnectResponse` taken from the
//! stream's first chunk (where a connector's whole preamble nearly always arrives, with the
//! start of the body behind it), and the body passed on chunk by chunk. Nothing is copied
//! and the stream's lock is taken once per chunk, where reading the preamble in exact
//! pieces and the body into a buffer of its own took it four times and copied every byte.

use std::future::Future as _;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;

use cftunnel_tunnel::stream::http_map::{decode_response_head, ConnectOutcome};
use cftunnel_tunnel::stream::{data_preamble_len, FrameError, DATA_SIGNATURE, DATA_VERSION};
use cftunnel_tunnel::BoxError;

use super::MockEdgeError;

/// Bytes before the framed `ConnectResponse`: the data signature and the version.
const PREFIX: usize = DATA_SIGNATURE.len() + DATA_VERSION.len();

/// Chunks taken from the stream in one read. A connector's answer usually comes as its
/// head and body in one chunk, or a few, and the end of the stream with them: a read that
/// takes the chunks there are up to the end also learns of the end, so a body the eyeball
/// reads to its `Content-Length` lets go of a finished stream, not one the edge would stop.
const CHUNKS: usize = 4;

/// Reads the connector's answer head off `recv`: the outcome, and the body, which starts
/// with whatever of the stream's bytes came in behind the head.
pub(super) async fn read(
    mut recv: quinn::RecvStream,
) -> Result<(ConnectOutcome, QuicBody), MockEdgeError> {
    let mut chunks = Chunks::default();
    // A preamble that spans chunks, gathered.
    let mut held: Option<BytesMut> = None;
    loop {
        if !chunks.read(&mut recv).await.map_err(read_err)? {
            return Err(frame_err(FrameError::Truncated));
        }
        while let Some(chunk) = chunks.pop() {
            let mut bytes = match held.take() {
                None => chunk,
                Some(mut joined) => {
                    joined.extend_from_slice(&chunk);
                    joined.freeze()
                }
            };
            let Some(end) = data_preamble_len(&bytes).map_err(frame_err)? else {
                held = Some(
                    bytes
                        .try_into_mut()
                        .unwrap_or_else(|b| BytesMut::from(&b[..])),
                );
                continue;
            };
            let rest = bytes.split_off(end);
            let frame = bytes.split_off(PREFIX);
            let outcome = decode_response_head(&frame)
                .map_err(frame_err)?
                .map_err(|e| MockEdgeError::Stream(e.to_string()))?;
            chunks.push_front(rest);
            return Ok((
                outcome,
                QuicBody {
                    chunks,
                    recv,
                    ended: false,
                },
            ));
        }
    }
}

/// Chunks read from the stream and not yet passed on, in order.
#[derive(Default)]
struct Chunks {
    bufs: [Bytes; CHUNKS],
    next: usize,
    end: usize,
}

impl Chunks {
    fn pop(&mut self) -> Option<Bytes> {
        (self.next < self.end).then(|| {
            self.next += 1;
            std::mem::take(&mut self.bufs[self.next - 1])
        })
    }

    /// Puts a non-empty `bytes` back in front, where the chunk just popped was.
    fn push_front(&mut self, bytes: Bytes) {
        if !bytes.is_empty() && self.next > 0 {
            self.next -= 1;
            self.bufs[self.next] = bytes;
        }
    }

    /// Reads the next chunks, once all read before are passed on; `false` at the end.
    async fn read(&mut self, recv: &mut quinn::RecvStream) -> Result<bool, quinn::ReadError> {
        std::future::poll_fn(|cx| self.poll_read(recv, cx)).await
    }

    fn poll_read(
        &mut self,
        recv: &mut quinn::RecvStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<bool, quinn::ReadError>> {
        // `read_chunks` is cancel-safe: a future that was not ready is dropped, and the
        // next poll asks again.
        let read = ready!(pin!(recv.read_chunks(&mut self.bufs)).poll(cx))?;
        self.next = 0;
        self.end = read.unwrap_or(0);
        Poll::Ready(Ok(read.is_some()))
    }
}

fn read_err(e: quinn::ReadError) -> MockEdgeError {
    frame_err(FrameError::Io(e.to_string()))
}

fn frame_err(e: FrameError) -> MockEdgeError {
    MockEdgeError::Stream(e.to_string())
}

/// A response body as the connector sends it on a QUIC stream, up to the stream's end.
/// Each chunk quinn received is passed on as it is; the stream is read only as the body
/// is polled, so the connector is flow-controlled by the eyeball. Dropped before the end,
/// the stream is stopped (`STOP_SENDING`, code 0), as the edge cancels one.
pub(super) struct QuicBody {
    /// Read and not yet passed on; at first, the body bytes that arrived with the head.
    chunks: Chunks,
    recv: quinn::RecvStream,
    ended: bool,
}

impl http_body::Body for QuicBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.chunks.pop() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(this.chunks.poll_read(&mut this.recv, cx)) {
                Ok(true) => {}
                Ok(false) => this.ended = true,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.chunks.next == self.chunks.end
    }
}

/// The body of every answer the edge gives an eyeball: a QUIC response body as it is, and
/// anything else (HTTP/2 bodies, the edge's own answers) boxed.
pub struct EdgeBody(Kind);

enum Kind {
    Quic(QuicBody),
    Boxed(UnsyncBoxBody<Bytes, BoxError>),
}

impl EdgeBody {
    pub(super) fn quic(body: QuicBody) -> Self {
        Self(Kind::Quic(body))
    }

    pub(super) fn boxed(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        Self(Kind::Boxed(body))
    }
}

impl std::fmt::Debug for EdgeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Kind::Quic(_) => "EdgeBody::Quic",
            Kind::Boxed(_) => "EdgeBody::Boxed",
        })
    }
}

impl http_body::Body for EdgeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Kind::Quic(b) => Pin::new(b).poll_frame(cx),
            Kind::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Quic(b) => b.is_end_stream(),
            Kind::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.0 {
            Kind::Quic(b) => b.size_hint(),
            Kind::Boxed(b) => b.size_hint(),
        }
    }
}
