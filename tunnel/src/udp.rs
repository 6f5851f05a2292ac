//! The UDP socket under every QUIC endpoint (the connector's and the mock edge's).
//!
//! quinn's own tokio socket reads until the kernel answers `EAGAIN`, so every wake-up costs
//! one `recvmmsg` that returns nothing: about one wasted system call per request on a
//! tunnel carrying one request per packet. A batch shorter than the buffers offered means
//! the receive queue was empty when the call returned, so this socket marks itself not
//! readable then, as tokio does for a short read on a TCP stream. A datagram that arrives
//! afterwards raises a new readiness event, which a stale clear cannot erase (tokio
//! clears only the event it handed out), so nothing is missed.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A quinn endpoint over `socket` (bound, non-blocking) with the tokio runtime.
pub(crate) fn endpoint(
    config: quinn::EndpointConfig,
    server: Option<quinn::ServerConfig>,
    socket: std::net::UdpSocket,
) -> io::Result<quinn::Endpoint> {
    quinn::Endpoint::new_with_abstract_socket(
        config,
        server,
        Arc::new(Socket::new(socket)?),
        Arc::new(quinn::TokioRuntime),
    )
}

/// A UDP socket registered with tokio's reactor, read and written with quinn-udp's
/// batched, ECN- and GSO-aware system calls.
pub(crate) struct Socket {
    io: AsyncFd<std::net::UdpSocket>,
    state: UdpSocketState,
}

impl Socket {
    /// Registers `socket` with the current runtime's reactor.
    #[allow(unsafe_code)]
    pub(crate) fn new(socket: std::net::UdpSocket) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new((&socket).into())?;
        // SAFETY: the `AsyncFd` owns the socket, so its descriptor stays open and names the
        // same socket until the `AsyncFd` is dropped.
        let io = unsafe {
            AsyncFd::register_with_interest(socket, Interest::READABLE | Interest::WRITABLE)
        }
        .map_err(io::Error::from)?;
        Ok(Self { io, state })
    }
}

impl fmt::Debug for Socket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Socket")
            .field("local_addr", &self.io.get_ref().local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for Socket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable(self))
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.io.try_io(Interest::WRITABLE, |socket| {
            self.state.send(socket.into(), transmit)
        })
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            // `try_io` clears readiness itself when the call answers `EAGAIN`.
            let Ok(result) = guard.try_io(|fd| self.state.recv(fd.get_ref().into(), bufs, meta))
            else {
                continue;
            };
            if let Ok(msgs) = result {
                if msgs < bufs.len().min(meta.len()).min(quinn::udp::BATCH_SIZE) {
                    guard.clear_ready();
                }
            }
            return Poll::Ready(result);
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.io.get_ref().local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

/// Waits for the socket to take more datagrams after a send found its buffer full.
struct Writable(Arc<Socket>);

impl fmt::Debug for Writable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Writable").field(&self.0).finish()
    }
}

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The guard is dropped without clearing: the next `try_send` finds out.
        let _guard = ready!(self.0.io.poll_write_ready(cx))?;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSliceMut;
    use std::net::UdpSocket;

    /// A receiving [`Socket`] and a plain sender, both on loopback, and where to send.
    fn bound_pair() -> (Socket, UdpSocket, std::net::SocketAddr) {
        let rx = Socket::new(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        (rx, tx, to)
    }

    fn recv_bufs(storage: &mut [[u8; 1500]]) -> Vec<IoSliceMut<'_>> {
        storage.iter_mut().map(|b| IoSliceMut::new(b)).collect()
    }

    fn poll_once(
        socket: &Socket,
        cx: &mut Context<'_>,
        storage: &mut [[u8; 1500]],
        meta: &mut [RecvMeta],
        into: &mut Vec<Vec<u8>>,
    ) -> Poll<usize> {
        let mut bufs = recv_bufs(storage);
        match socket.poll_recv(cx, &mut bufs, meta) {
            Poll::Ready(Ok(n)) => {
                for (m, b) in meta.iter().zip(bufs.iter()).take(n) {
                    into.push(b[..m.len].to_vec());
                }
                Poll::Ready(n)
            }
            Poll::Ready(Err(e)) => panic!("recv failed: {e}"),
            Poll::Pending => Poll::Pending,
        }
    }

    /// After a batch shorter than the buffers the socket does not call the kernel again
    /// until the reactor reports new data, and every datagram is still read, in order.
    #[tokio::test]
    async fn a_short_batch_waits_for_the_reactor_and_loses_nothing() {
        let (rx, tx, to) = bound_pair();
        let mut storage = vec![[0u8; 1500]; 4];
        let mut meta = [RecvMeta::default(); 4];
        let mut received = Vec::new();
        for round in 0u8..20 {
            let count = round % 3 + 1;
            for i in 0..count {
                tx.send_to(&[round, i], to).unwrap();
            }
            let mut got = 0;
            while got < usize::from(count) {
                got += std::future::poll_fn(|cx| {
                    poll_once(&rx, cx, &mut storage, &mut meta, &mut received)
                })
                .await;
            }
            // Loopback queues the next datagram before `send_to` returns, but the reactor
            // has not run since the short batch: this poll must not read it.
            tx.send_to(&[round, 99], to).unwrap();
            let early = std::future::poll_fn(|cx| {
                Poll::Ready(poll_once(&rx, cx, &mut storage, &mut meta, &mut received))
            })
            .await;
            assert!(
                early.is_pending(),
                "round {round}: read the kernel again after a short batch"
            );
            // Once the reactor has seen it, it is read.
            let n = std::future::poll_fn(|cx| {
                poll_once(&rx, cx, &mut storage, &mut meta, &mut received)
            })
            .await;
            assert_eq!(n, 1, "round {round}");
        }
        let expected: Vec<Vec<u8>> = (0u8..20)
            .flat_map(|r| (0..(r % 3 + 1)).chain([99]).map(move |i| vec![r, i]))
            .collect();
        assert_eq!(received, expected);
    }

    /// A batch that fills every buffer may have left datagrams queued: the next poll
    /// reads them without waiting for the reactor.
    #[tokio::test]
    async fn a_full_batch_reads_on() {
        let (rx, tx, to) = bound_pair();
        let mut storage = vec![[0u8; 1500]; 2];
        let mut meta = [RecvMeta::default(); 2];
        let mut received = Vec::new();
        // Wait until the reactor has seen the first datagram.
        tx.send_to(&[0], to).unwrap();
        std::future::poll_fn(|cx| rx.io.poll_read_ready(cx).map(|r| r.map(drop)))
            .await
            .unwrap();
        for i in 1..5u8 {
            tx.send_to(&[i], to).unwrap();
        }
        let polls = std::future::poll_fn(|cx| {
            let mut polls = Vec::new();
            for _ in 0..3 {
                polls.push(poll_once(&rx, cx, &mut storage, &mut meta, &mut received));
            }
            Poll::Ready(polls)
        })
        .await;
        assert_eq!(
            polls,
            vec![Poll::Ready(2), Poll::Ready(2), Poll::Ready(1)],
            "full batches must not stop the reading"
        );
        assert_eq!(received, (0..5u8).map(|i| vec![i]).collect::<Vec<_>>());
    }

    /// A datagram arriving after the drained mark wakes the task waiting on the socket.
    #[tokio::test]
    async fn a_datagram_after_a_drained_batch_wakes_the_reader() {
        let (rx, tx, to) = bound_pair();
        tx.send_to(b"first", to).unwrap();
        let reader = tokio::spawn(async move {
            let mut storage = vec![[0u8; 1500]; 2];
            let mut meta = [RecvMeta::default(); 2];
            let mut seen = Vec::new();
            while seen.len() < 2 {
                std::future::poll_fn(|cx| poll_once(&rx, cx, &mut storage, &mut meta, &mut seen))
                    .await;
            }
            seen
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tx.send_to(b"second", to).unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("the reader was not woken by the second datagram")
            .unwrap();
        assert_eq!(seen, vec![b"first".to_vec(), b"second".to_vec()]);
    }

    /// Sends wait for the reactor's writable report through the poller, then go out
    /// through quinn-udp and arrive whole.
    #[tokio::test]
    async fn sends_a_transmit() {
        let tx = Arc::new(Socket::new(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap());
        let mut poller = tx.clone().create_io_poller();
        std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx))
            .await
            .unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let transmit = Transmit {
            destination: rx.local_addr().unwrap(),
            ecn: None,
            contents: b"datagram",
            segment_size: None,
            src_ip: None,
        };
        tx.try_send(&transmit).unwrap();
        let mut buf = [0u8; 64];
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"datagram");
    }
}
