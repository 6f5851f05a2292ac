//! Liveness of an HTTP/2 edge connection. QUIC notices a silent edge by its idle timeout;
//! over TCP a half-open connection is only found by keep-alive probes (150 s) or, with
//! unacknowledged data, by retransmission giving up (many minutes). So the connector sends
//! an HTTP/2 PING after each quiet interval and declares the edge silent when nothing at
//! all arrives for a further interval while one is outstanding. Any byte read counts as
//! life, so a PONG queued behind a long upload cannot make a busy connection look dead.
//! Public for the edge's side, which watches its HTTP/2 connections the same way.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Wraps a connection's transport and counts the bytes read from it.
pub struct Heard<T> {
    inner: T,
    read: Arc<AtomicU64>,
}

impl<T> Heard<T> {
    /// Wraps `inner`; the counter returned with it is what [`silent`] watches.
    pub fn new(inner: T) -> (Self, Arc<AtomicU64>) {
        let read = Arc::new(AtomicU64::new(0));
        (
            Self {
                inner,
                read: read.clone(),
            },
            read,
        )
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Heard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.read.fetch_add(n as u64, Relaxed);
        }
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Heard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves when the peer has gone silent: every `every` a PING goes out, and while it is
/// outstanding a whole `timeout` passes without a byte read. Any byte counts as an answer,
/// so a PONG queued behind a large body does not make a busy connection look dead. Never
/// resolves while the peer answers, once the connection has failed (its own error ends it),
/// or without `pings` (h2 hands them out once). The connection must be polled alongside,
/// or no PING goes out and no PONG is read.
pub async fn silent(
    pings: Option<h2::PingPong>,
    read: Arc<AtomicU64>,
    every: Duration,
    timeout: Duration,
) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(every).await;
        let pong = pings.ping(h2::Ping::opaque());
        tokio::pin!(pong);
        let mut heard = read.load(Relaxed);
        loop {
            tokio::select! {
                biased;
                r = &mut pong => match r {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "http2 ping failed");
                        return std::future::pending().await;
                    }
                },
                _ = tokio::time::sleep(timeout) => {
                    // Let the connection read what has arrived before judging: under load
                    // the timer can fire before the reads queued ahead of it.
                    tokio::task::yield_now().await;
                    let now = read.load(Relaxed);
                    if now == heard {
                        return;
                    }
                    heard = now;
                }
            }
        }
    }
}
