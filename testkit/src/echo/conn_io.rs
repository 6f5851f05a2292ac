//! The byte stream under one echo connection: replays bytes already read while sniffing the
//! protocol, and can end the connection with a TCP RST instead of a FIN.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Lets a request handler abort its own connection with an RST (the `/retry/` handler's
/// connection-error mode, which echo-basic implements with `SO_LINGER 0`).
#[derive(Debug, Default)]
pub(crate) struct ConnControl {
    reset: AtomicBool,
    abort: Notify,
}

impl ConnControl {
    /// Marks the socket for an abortive close and wakes the connection task, which then drops
    /// the connection (and with it the socket).
    pub(crate) fn reset(&self) {
        self.reset.store(true, Ordering::SeqCst);
        // notify_one stores a permit, so the wake-up is not lost if nobody waits yet.
        self.abort.notify_one();
    }

    /// Resolves once [`ConnControl::reset`] has been called.
    pub(crate) async fn aborted(&self) {
        self.abort.notified().await;
    }
}

/// A TCP stream with an optional already-read prefix.
pub(crate) struct ConnIo {
    prefix: Bytes,
    stream: TcpStream,
    control: Arc<ConnControl>,
}

impl ConnIo {
    pub(crate) fn new(prefix: Bytes, stream: TcpStream, control: Arc<ConnControl>) -> Self {
        Self {
            prefix,
            stream,
            control,
        }
    }
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if self.control.reset.load(Ordering::SeqCst) {
            // SO_LINGER 0: the close that follows sends RST and discards unsent data.
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
