//! A bound on what an RPC session holds for a peer that stops reading: `capnp-rpc` queues
//! outgoing messages without bound, so while a write waits for the peer the session reads
//! nothing more, leaving the peer's further calls to the transport's flow control. Only the
//! connector's end is gated: two gated ends could wait for each other.
//! See docs/design/rpc-backpressure.md.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Whether the writer is waiting for the peer, and who to wake when it is not.
#[derive(Debug, Default)]
struct Gate {
    stalled: AtomicBool,
    reader: AtomicWaker,
}

impl Gate {
    /// Records the outcome of a write, flush or shutdown poll.
    fn note<T>(&self, poll: &Poll<T>) {
        if poll.is_pending() {
            self.stalled.store(true, Ordering::Release);
        } else if self.stalled.swap(false, Ordering::AcqRel) {
            self.reader.wake();
        }
    }
}

/// Splits a session's byte streams into a reader that pauses while the
/// writer is stalled, and that writer.
pub(crate) fn gate<R, W>(reader: R, writer: W) -> (GatedReader<R>, WatchedWriter<W>) {
    let gate = Arc::new(Gate::default());
    (
        GatedReader {
            inner: reader,
            gate: gate.clone(),
        },
        WatchedWriter {
            inner: writer,
            gate,
        },
    )
}

/// The session's reader: reads only while no write is waiting for the peer.
#[derive(Debug)]
pub(crate) struct GatedReader<R> {
    inner: R,
    gate: Arc<Gate>,
}

impl<R: AsyncRead + Unpin> AsyncRead for GatedReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.gate.stalled.load(Ordering::Acquire) {
            self.gate.reader.register(cx.waker());
            // Checked again: the writer may have moved on between the load and
            // the registration, and would then have woken no one.
            if self.gate.stalled.load(Ordering::Acquire) {
                return Poll::Pending;
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// The session's writer, reporting to the reader whether it waits.
#[derive(Debug)]
pub(crate) struct WatchedWriter<W> {
    inner: W,
    gate: Arc<Gate>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WatchedWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.gate.note(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.gate.note(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.gate.note(&poll);
        poll
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.gate.note(&poll);
        poll
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn reading_pauses_while_a_write_waits_and_resumes_after() {
        // The peer's end of two small pipes: it writes into `incoming` and reads (or not)
        // from `outgoing`.
        let (ours_in, mut peer_out) = tokio::io::duplex(64);
        let (ours_out, mut peer_in) = tokio::io::duplex(64);
        let (mut reader, mut writer) = gate(ours_in, ours_out);
        peer_out.write_all(b"abcd").await.unwrap();
        let mut got = [0u8; 4];
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd", "reads pass while nothing waits");

        // Fill the outgoing pipe: the next write waits for the peer.
        writer.write_all(&[0u8; 64]).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(50), writer.write_all(b"x")).await;
        assert!(waiting.is_err(), "the pipe is full");
        peer_out.write_all(b"efgh").await.unwrap();
        let paused = tokio::time::timeout(Duration::from_millis(100), reader.read(&mut got)).await;
        assert!(paused.is_err(), "nothing is read while the write waits");

        // The peer reads: the write completes and reading goes on.
        let mut drained = [0u8; 64];
        peer_in.read_exact(&mut drained).await.unwrap();
        writer.write_all(b"x").await.unwrap();
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"efgh");
    }
}
