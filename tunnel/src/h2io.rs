//! Byte-stream adapters over h2 streams (control stream, WebSocket pipes)
//! and body streaming with h2 flow control. Public for the edge's side of the HTTP/2
//! transport, which carries its RPC sessions and upgraded streams over the same adapters.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::Body as HttpBody;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const MAX_WRITE: usize = 64 * 1024;

fn h2_io_err(e: h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, e)
}

/// Read half of an h2 stream as `AsyncRead`.
pub struct H2Reader {
    recv: h2::RecvStream,
    pending: Bytes,
}

impl H2Reader {
    /// Reads `recv`, releasing its flow-control capacity as bytes are taken.
    pub fn new(recv: h2::RecvStream) -> Self {
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
///
/// Dropping it ends the stream (END_STREAM) as a shutdown does, where h2 on its own would
/// reset it: a byte stream (an RPC session, an upgraded connection) that its owner lets go
/// of has ended, as when a Go handler returns and as quinn finishes a dropped QUIC stream.
pub struct H2Writer {
    send: h2::SendStream<Bytes>,
    ended: bool,
}

impl H2Writer {
    /// Writes to `send`.
    pub fn new(send: h2::SendStream<Bytes>) -> Self {
        Self { send, ended: false }
    }

    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            let _ = self.send.send_data(Bytes::new(), true);
        }
    }
}

impl Drop for H2Writer {
    fn drop(&mut self) {
        self.end();
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
        self.end();
        Poll::Ready(Ok(()))
    }
}

/// Both halves of an h2 stream.
pub struct H2Io {
    reader: H2Reader,
    writer: H2Writer,
}

impl H2Io {
    /// Joins the two halves of one h2 stream into one byte stream.
    pub fn new(recv: h2::RecvStream, send: h2::SendStream<Bytes>) -> Self {
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
///
/// With a `send_timeout`, a wait for stream capacity (the peer lets nothing more through)
/// that lasts that long ends with a [`io::ErrorKind::TimedOut`] error; each wait has its own
/// timer, so a peer that lets data through slowly but steadily is not cut, and a body slow
/// to produce its frames is not bounded by it. `None`: the wait is unbounded.
pub async fn send_body<B>(
    send: &mut h2::SendStream<Bytes>,
    body: B,
    send_timeout: Option<Duration>,
) -> io::Result<()>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    loop {
        // A body with nothing to send yet also watches for the peer resetting the stream, so
        // an idle response whose reader went away ends here rather than at its next frame.
        let frame = std::future::poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Ok(frame)),
            Poll::Pending => match send.poll_reset(cx) {
                Poll::Ready(Ok(reason)) => Poll::Ready(Err(io::Error::other(format!(
                    "stream reset by the peer: {reason}"
                )))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(h2_io_err(e))),
                Poll::Pending => Poll::Pending,
            },
        })
        .await?;
        let Some(frame) = frame else {
            send.send_data(Bytes::new(), true).map_err(h2_io_err)?;
            return Ok(());
        };
        let frame = frame.map_err(|e| io::Error::other(e.into()))?;
        match frame.into_data() {
            Ok(mut data) => {
                while !data.is_empty() {
                    let want = data.len();
                    let n = match send_timeout {
                        None => std::future::poll_fn(|cx| poll_send_capacity(send, cx, want)).await,
                        Some(limit) => crate::send_timeout::within(limit, |cx| {
                            poll_send_capacity(send, cx, want)
                        })
                        .await
                        .map_err(|e| io::Error::new(io::ErrorKind::TimedOut, e))?,
                    }?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use tokio::io::AsyncWriteExt as _;

    /// What the client end of one h2 stream receives after the server writes `hi` into an
    /// [`H2Writer`] and drops it: the data, then either the end of the stream or an error.
    async fn after_a_dropped_writer() -> (Vec<u8>, Result<(), h2::Error>) {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
            let driver = tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let send = respond.send_response(Response::new(()), false).unwrap();
            let mut writer = H2Writer::new(send);
            writer.write_all(b"hi").await.unwrap();
            drop(writer);
            driver.abort_handle()
        });
        let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(conn);
        let (resp, _send) = client
            .send_request(Request::get("http://edge/").body(()).unwrap(), false)
            .unwrap();
        let mut body = resp.await.unwrap().into_body();
        let mut got = Vec::new();
        let outcome = loop {
            match body.data().await {
                Some(Ok(data)) => got.extend_from_slice(&data),
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        };
        server.await.unwrap().abort();
        (got, outcome)
    }

    #[tokio::test]
    async fn a_dropped_writer_ends_its_stream_instead_of_resetting_it() {
        let (got, outcome) = after_a_dropped_writer().await;
        assert_eq!(got, b"hi");
        assert!(outcome.is_ok(), "stream reset: {outcome:?}");
    }
}
