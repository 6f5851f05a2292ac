//! The UDP socket under every QUIC endpoint (the connector's, and a test edge's through
//! [`endpoint`]). It saves two system calls per packet against quinn's own tokio socket: a
//! short receive batch marks the socket drained, and it is registered for writability only
//! after a send finds the buffer full. See docs/design/quic-udp-socket.md.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A quinn endpoint over `socket` (bound, non-blocking) with the tokio runtime. Public so
/// that an edge's endpoint (`server` set) runs on the same socket as the connector's.
pub fn endpoint(
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
    /// Registered for reading only.
    io: AsyncFd<std::net::UdpSocket>,
    state: UdpSocketState,
    /// A send found the buffer full, and no send has gone out since.
    blocked: AtomicBool,
    /// While `blocked`: a duplicate of the descriptor registered for writability, shared by
    /// the pollers waiting on it. Taken out by the send that goes out again; the
    /// registration ends when the last waiter lets go of it.
    write_wait: Mutex<Option<Arc<AsyncFd<std::net::UdpSocket>>>>,
}

impl Socket {
    /// Registers `socket` with the current runtime's reactor.
    pub(crate) fn new(socket: std::net::UdpSocket) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new((&socket).into())?;
        Ok(Self {
            io: register(socket, Interest::READABLE)?,
            state,
            blocked: AtomicBool::new(false),
            write_wait: Mutex::new(None),
        })
    }

    /// The slot of [`Socket::write_wait`]; a poisoned lock still holds a usable `Option`.
    fn wait_slot(&self) -> MutexGuard<'_, Option<Arc<AsyncFd<std::net::UdpSocket>>>> {
        self.write_wait
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The writability registration to wait on, made on first use; `None` when sends are
    /// not blocked.
    fn write_wait(&self) -> io::Result<Option<Arc<AsyncFd<std::net::UdpSocket>>>> {
        if !self.blocked.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut slot = self.wait_slot();
        if let Some(wait) = &*slot {
            return Ok(Some(wait.clone()));
        }
        // Registering reports the socket writable at once if it already is: a buffer that
        // drained between the failed send and now is not missed.
        let wait = Arc::new(register(
            self.io.get_ref().try_clone()?,
            Interest::WRITABLE,
        )?);
        *slot = Some(wait.clone());
        Ok(Some(wait))
    }
}

/// Registers `socket` with the current runtime's reactor for `interest`.
#[allow(unsafe_code)]
fn register(
    socket: std::net::UdpSocket,
    interest: Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: the `AsyncFd` owns the socket, so its descriptor stays open and names the
    // same socket until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(io::Error::from)
}

impl fmt::Debug for Socket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Socket")
            .field("local_addr", &self.io.get_ref().local_addr().ok())
            .field("blocked", &self.blocked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for Socket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable {
            socket: self,
            wait: None,
        })
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let wait = if self.blocked.load(Ordering::Acquire) {
            self.wait_slot().clone()
        } else {
            None
        };
        let sent = match &wait {
            // `try_io` clears the writable report when the buffer is still full, so the
            // next wait lasts until the kernel frees space.
            Some(wait) => wait.try_io(Interest::WRITABLE, |socket| {
                self.state.send(socket.into(), transmit)
            }),
            // Not blocked; or blocked with no connection waiting, as when the endpoint
            // answers on its own (stateless resets, refusals), which never waits: the
            // kernel is asked, so a drained buffer is found without a registration.
            None => self.state.send(self.io.get_ref().into(), transmit),
        };
        match &sent {
            Ok(()) if self.blocked.load(Ordering::Relaxed) => {
                self.blocked.store(false, Ordering::Release);
                self.wait_slot().take();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.blocked.store(true, Ordering::Release);
            }
            _ => {}
        }
        sent
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
            // A short batch means the queue was empty; a datagram arriving since raises a
            // new readiness event, which this clear (of the event handed out) cannot erase.
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

type WaitFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>;

/// One connection's wait for the socket to take more datagrams after a send found its
/// buffer full. Each connection waits on a future of its own, so every waiter is woken.
struct Writable {
    socket: Arc<Socket>,
    wait: Option<WaitFuture>,
}

impl fmt::Debug for Writable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writable")
            .field("socket", &self.socket)
            .field("waiting", &self.wait.is_some())
            .finish()
    }
}

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let wait = match &mut this.wait {
            Some(wait) => wait,
            None => {
                let wait: WaitFuture = match this.socket.write_wait() {
                    Ok(None) => return Poll::Ready(Ok(())),
                    // The guard is dropped without clearing: the next `try_send` finds out.
                    Ok(Some(registration)) => {
                        Box::pin(async move { registration.writable().await.map(drop) })
                    }
                    // No descriptor or registration to spare (e.g. out of descriptors): a
                    // failed poll would end the connection, so the send is retried a little
                    // later instead.
                    Err(e) => {
                        tracing::debug!(error = %e, "no writability registration; retrying");
                        Box::pin(async {
                            tokio::time::sleep(REGISTRATION_RETRY).await;
                            Ok(())
                        })
                    }
                };
                this.wait.insert(wait)
            }
        };
        let result = ready!(wait.as_mut().poll(cx));
        this.wait = None;
        Poll::Ready(result)
    }
}

/// How long a connection waits before sending again when the socket could not be
/// registered for writability.
const REGISTRATION_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

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

    fn transmit_to(destination: std::net::SocketAddr, contents: &[u8]) -> Transmit<'_> {
        Transmit {
            destination,
            ecn: None,
            contents,
            segment_size: None,
            src_ip: None,
        }
    }

    fn recv_one(rx: &UdpSocket) -> Vec<u8> {
        let mut buf = [0u8; 64];
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let n = rx.recv(&mut buf).unwrap();
        buf[..n].to_vec()
    }

    /// With room in the buffer, the poller does not wait and a send goes straight out,
    /// with no writability registration made.
    #[tokio::test]
    async fn sends_go_straight_out() {
        let tx = Arc::new(Socket::new(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap());
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut poller = tx.clone().create_io_poller();
        let ready = std::future::poll_fn(|cx| Poll::Ready(poller.as_mut().poll_writable(cx))).await;
        assert!(matches!(ready, Poll::Ready(Ok(()))));
        tx.try_send(&transmit_to(rx.local_addr().unwrap(), b"datagram"))
            .unwrap();
        assert_eq!(recv_one(&rx), b"datagram");
        assert!(tx.write_wait.lock().unwrap().is_none());
    }

    /// After a send found the buffer full (set by hand: loopback frees a datagram's buffer
    /// space inside the send, so it cannot fill), connections wait for the reactor: each one
    /// that asks is told once the socket is writable, the next send goes out through the
    /// registration, and the socket is back to sending straight away.
    #[tokio::test]
    async fn a_full_buffer_waits_for_the_reactor_then_unblocks() {
        let tx = Arc::new(Socket::new(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap());
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        tx.blocked.store(true, Ordering::Release);
        let mut first = tx.clone().create_io_poller();
        let mut second = tx.clone().create_io_poller();
        let both = async {
            std::future::poll_fn(|cx| first.as_mut().poll_writable(cx)).await?;
            std::future::poll_fn(|cx| second.as_mut().poll_writable(cx)).await
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), both)
            .await
            .expect("the writable socket was not reported to every poller")
            .unwrap();
        assert!(tx.write_wait.lock().unwrap().is_some());
        tx.try_send(&transmit_to(to, b"after")).unwrap();
        assert_eq!(recv_one(&rx), b"after");
        assert!(!tx.blocked.load(Ordering::Acquire));
        assert!(tx.write_wait.lock().unwrap().is_none());
        tx.try_send(&transmit_to(to, b"straight")).unwrap();
        assert_eq!(recv_one(&rx), b"straight");
    }

    /// The endpoint's own answers (stateless resets, refusals) are sent without asking a
    /// poller first: while blocked with no connection waiting, a send still asks the
    /// kernel, and one that goes out ends the blocked state.
    #[tokio::test]
    async fn a_send_with_nobody_waiting_asks_the_kernel() {
        let tx = Socket::new(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.blocked.store(true, Ordering::Release);
        tx.try_send(&transmit_to(rx.local_addr().unwrap(), b"reset"))
            .unwrap();
        assert_eq!(recv_one(&rx), b"reset");
        assert!(!tx.blocked.load(Ordering::Acquire));
    }
}
