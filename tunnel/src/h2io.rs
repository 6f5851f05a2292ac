//! Byte-stream adapters over h2 streams (control stream, WebSocket pipes)
//! and body streaming with h2 flow control.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::Body as HttpBody;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const MAX_WRITE: usize = 64 * 1024;

fn h2_io_err(e: h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, e)
}

/// Read half of an h2 stream as `AsyncRead`.
pub(crate) struct H2Reader {
    recv: h2::RecvStream,
    pending: Bytes,
}

impl H2Reader {
    pub(crate) fn new(recv: h2::RecvStream) -> Self {
        Self {
            recv,
            pending: Bytes::new(),
        }
    }
}

impl AsyncRead for H2Reader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.pending = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_io_err(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// Write half of an h2 stream as `AsyncWrite`; every write is sent at once.
pub(crate) struct H2Writer {
    send: h2::SendStream<Bytes>,
}

impl H2Writer {
    pub(crate) fn new(send: h2::SendStream<Bytes>) -> Self {
        Self { send }
    }
}

fn poll_send_capacity(
    send: &mut h2::SendStream<Bytes>,
    cx: &mut Context<'_>,
    want: usize,
) -> Poll<io::Result<usize>> {
    loop {
        let cap = send.capacity();
        if cap > 0 {
            return Poll::Ready(Ok(cap.min(want)));
        }
        send.reserve_capacity(want.min(MAX_WRITE));
        match ready!(send.poll_capacity(cx)) {
            None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Some(Err(e)) => return Poll::Ready(Err(h2_io_err(e))),
            // Capacity changed (possibly to zero): look again; h2 reports a
            // change once, so the next poll registers the waker.
            Some(Ok(_)) => {}
        }
    }
}

impl AsyncWrite for H2Writer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = ready!(poll_send_capacity(&mut self.send, cx, buf.len()))?;
        self.send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_io_err)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = self.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}

/// Both halves of an h2 stream.
pub(crate) struct H2Io {
    reader: H2Reader,
    writer: H2Writer,
}

impl H2Io {
    pub(crate) fn new(recv: h2::RecvStream, send: h2::SendStream<Bytes>) -> Self {
        Self {
            reader: H2Reader::new(recv),
            writer: H2Writer::new(send),
        }
    }
}

impl AsyncRead for H2Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

/// Streams `body` into an h2 stream with flow control: data frames, then
/// trailers if the body has any, else an empty end-of-stream frame.
pub(crate) async fn send_body<B>(send: &mut h2::SendStream<Bytes>, body: B) -> io::Result<()>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    loop {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let Some(frame) = frame else {
            send.send_data(Bytes::new(), true).map_err(h2_io_err)?;
            return Ok(());
        };
        let frame = frame.map_err(|e| io::Error::other(e.into()))?;
        match frame.into_data() {
            Ok(mut data) => {
                while !data.is_empty() {
                    let n =
                        std::future::poll_fn(|cx| poll_send_capacity(send, cx, data.len())).await?;
                    let chunk = data.split_to(n);
                    let last = data.is_empty() && body.is_end_stream();
                    send.send_data(chunk, last).map_err(h2_io_err)?;
                    if last {
                        return Ok(());
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers).map_err(h2_io_err)?;
                    return Ok(());
                }
            }
        }
    }
}
