//! Dials one fixed backend, whatever the request URI says, optionally over TLS.

use super::tls::TlsTarget;
use cftunnel_config::address::{is_public_with, ClusterRanges};
use std::io;
use std::net::{IpAddr, SocketAddr};
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
    /// Dial only public addresses of `host` (see [`cftunnel_config::address::is_public`]) outside these ranges of the
    /// cluster's own.
    public_only: Option<ClusterRanges>,
    /// This backend's share of the process's [`LOOKUPS`].
    lookups: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, Clone)]
pub(crate) struct Connector {
    target: Arc<Target>,
}

impl Connector {
    /// A connector to `host:port`; with `public_only`, only public addresses of `host` outside
    /// the cluster's ranges it holds are dialled, checked at each dial.
    pub(crate) fn new(
        host: &str,
        port: u16,
        tls: Option<TlsTarget>,
        timeout: Duration,
        public_only: Option<ClusterRanges>,
    ) -> Self {
        Self {
            target: Arc::new(Target {
                host: host.into(),
                port,
                label: format!("{host}:{port}").into(),
                tls,
                timeout,
                public_only,
                lookups: Arc::new(tokio::sync::Semaphore::new(BACKEND_LOOKUP_SLOTS)),
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
    let deadline = tokio::time::Instant::now() + t.timeout;
    let tcp = tokio::time::timeout_at(deadline, dial(t, deadline))
        .await
        .map_err(|_| err(ConnectErrorKind::Timeout, "connect timed out".into()))?
        .map_err(|e| err(ConnectErrorKind::Dial, e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&crate::tcp_keepalive());
    let Some(tls) = &t.tls else {
        return Ok(Stream::Plain(tcp));
    };
    let handshake = tls.connector().connect(tls.server_name().clone(), tcp);
    // Within the dial's one bound, as the docs give it: not a second one of its own.
    let stream = tokio::time::timeout_at(deadline, handshake)
        .await
        .map_err(|_| err(ConnectErrorKind::Timeout, "TLS handshake timed out".into()))?
        .map_err(|e| err(handshake_error_kind(&e), e.to_string()))?;
    Ok(Stream::Tls(Box::new(stream)))
}

/// What a failed handshake counts as. TLS itself failing (a certificate refused, an alert, a
/// malformed message: rustls's errors, which reach here as `InvalidData`) is `Tls`, a matter of
/// configuration that another try would not cure. The connection dropping under it (a
/// backend pod going away mid-handshake: a reset, an end of stream) is the same as failing to
/// connect, and is retried as such.
fn handshake_error_kind(e: &io::Error) -> ConnectErrorKind {
    let from_rustls = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
    if from_rustls || e.kind() == io::ErrorKind::InvalidData {
        ConnectErrorKind::Tls
    } else {
        ConnectErrorKind::Dial
    }
}

/// Opens the TCP connection. A public-only target is resolved here and connected to by the
/// checked addresses themselves, never by name again, so a record that changes between the
/// check and the connect (DNS rebinding) cannot lead elsewhere.
async fn dial(t: &Target, deadline: tokio::time::Instant) -> io::Result<TcpStream> {
    let addrs = resolve(&t.host, t.port, &t.lookups).await?;
    let Some(cluster) = &t.public_only else {
        return connect_each(&addrs, deadline).await;
    };
    let addrs: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| is_public_with(a.ip(), cluster))
        .collect();
    if addrs.is_empty() {
        tracing::debug!(
            host = %t.host,
            "backend refused: its addresses are not public or are the cluster's own (publicOnly)"
        );
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} resolves to no public address outside the cluster's ranges (publicOnly)",
                t.host
            ),
        ));
    }
    connect_each(&addrs, deadline).await
}

/// Least time one of several addresses gets, as Go's dialer gives it.
const MIN_ADDRESS_SHARE: Duration = Duration::from_secs(2);

/// Connects to the first of `addrs` that takes the connection, in order, each given an even
/// share of the time left before `deadline` (at least [`MIN_ADDRESS_SHARE`]; the last, all of
/// it): an address that drops connection attempts (a dead node, IPv6 records in a cluster
/// without IPv6) must not take the whole dial from the ones that answer.
async fn connect_each(
    addrs: &[SocketAddr],
    deadline: tokio::time::Instant,
) -> io::Result<TcpStream> {
    let mut failed = None;
    for (i, addr) in addrs.iter().enumerate() {
        let now = tokio::time::Instant::now();
        let left = deadline.saturating_duration_since(now);
        let others = u32::try_from(addrs.len() - i).unwrap_or(u32::MAX);
        let share = (left / others).max(MIN_ADDRESS_SHARE).min(left);
        match tokio::time::timeout(share, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(e)) => failed = Some(e),
            Err(_) => {
                failed = Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {addr} timed out"),
                ));
            }
        }
    }
    Err(failed.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the name resolved to no address",
        )
    }))
}

/// Host-name lookups in flight at once, in the whole process. A lookup is a blocking
/// `getaddrinfo` call on the runtime's blocking pool (512 threads), which with DNS not answering
/// holds its thread for about 20 s; unbounded, a burst of dials to such a backend would take the
/// whole pool from what else needs it (edge discovery, file reads, freeing old tables). With
/// DNS answering, lookups take milliseconds and this many is never reached.
const LOOKUP_SLOTS: usize = 64;
static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LOOKUP_SLOTS);
/// Of [`LOOKUP_SLOTS`], those one backend may hold: a backend whose DNS does not answer
/// (stuck lookups keep their slots about 20 s) leaves the rest to every other backend's dials.
const BACKEND_LOOKUP_SLOTS: usize = 8;

/// The addresses of `host`: an IP literal as it is, a name by the system resolver within one
/// of the backend's `own` slots and one of the process's [`LOOKUPS`]. Waiting for a slot counts
/// within the dial's timeout.
async fn resolve(
    host: &str,
    port: u16,
    own: &Arc<tokio::sync::Semaphore>,
) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let host = host.to_owned();
    lookup(own, &LOOKUPS, move || {
        std::net::ToSocketAddrs::to_socket_addrs(&(&*host, port)).map(Iterator::collect)
    })
    .await
}

/// Runs the blocking `resolve` on the blocking pool once one of `own` (the backend's) and one
/// of `slots` (the process's) are free. The slots belong to the call, not to its caller: a
/// caller that gives up (its dial timed out) leaves them taken until the call returns, so stuck
/// lookups never hold more threads than `slots` has, nor one backend's more than `own` has.
async fn lookup<F>(
    own: &Arc<tokio::sync::Semaphore>,
    slots: &'static tokio::sync::Semaphore,
    resolve: F,
) -> io::Result<Vec<SocketAddr>>
where
    F: FnOnce() -> io::Result<Vec<SocketAddr>> + Send + 'static,
{
    let own = own
        .clone()
        .acquire_owned()
        .await
        .map_err(io::Error::other)?;
    let slot = slots.acquire().await.map_err(io::Error::other)?;
    tokio::task::spawn_blocking(move || {
        let _slots = (own, slot);
        resolve()
    })
    .await
    .map_err(io::Error::other)?
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

#[cfg(test)]
mod tests {
    use super::{connect_each, lookup, BACKEND_LOOKUP_SLOTS, LOOKUP_SLOTS, MIN_ADDRESS_SHARE};
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::Semaphore;

    /// An address that drops connection attempts gets its share of the dial, and the next
    /// address the rest: it is connected to, not given up on with the first.
    #[tokio::test]
    async fn an_address_that_does_not_answer_leaves_time_for_the_next() {
        // A listener whose accept queue is full: the kernel drops further connection attempts.
        let full = tokio::net::TcpSocket::new_v4().expect("socket");
        full.bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind");
        let full = full.listen(0).expect("listen");
        let silent = full.local_addr().expect("addr");
        let mut queued = Vec::new();
        for _ in 0..2 {
            match tokio::time::timeout(
                Duration::from_millis(300),
                tokio::net::TcpStream::connect(silent),
            )
            .await
            {
                Ok(Ok(conn)) => queued.push(conn),
                _ => break,
            }
        }
        let live = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let live_addr = live.local_addr().expect("addr");

        let started = tokio::time::Instant::now();
        let deadline = started + 2 * MIN_ADDRESS_SHARE;
        let conn = connect_each(&[silent, live_addr], deadline)
            .await
            .expect("the second address is connected to");
        assert_eq!(conn.peer_addr().expect("peer"), live_addr);
        let took = started.elapsed();
        assert!(
            took >= MIN_ADDRESS_SHARE && took < MIN_ADDRESS_SHARE + Duration::from_secs(1),
            "the silent address had its share and no more: {took:?}"
        );
        drop(queued);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_lookup_keeps_its_slot_after_its_caller_gave_up() {
        static SLOTS: Semaphore = Semaphore::const_new(1);
        let own = Arc::new(Semaphore::new(BACKEND_LOOKUP_SLOTS));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let mine = own.clone();
        let first = tokio::spawn(async move {
            lookup(&mine, &SLOTS, move || {
                let _ = started.send(());
                let _ = stuck.recv();
                Ok(Vec::new())
            })
            .await
        });
        running.await.expect("the first lookup runs");
        // Its dial timed out: the caller is gone, the blocking call is not.
        first.abort();
        let _ = first.await;
        let second = lookup(&own, &SLOTS, || {
            Ok(vec![SocketAddr::from(([127, 0, 0, 1], 1))])
        });
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut second)
                .await
                .is_err(),
            "a second lookup waits while the first still runs"
        );
        release.send(()).expect("the first lookup is still running");
        let addrs = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the slot is free once the first lookup returned")
            .expect("resolved");
        assert_eq!(addrs, vec![SocketAddr::from(([127, 0, 0, 1], 1))]);
    }

    /// A backend whose lookups are stuck holds no more than its own slots: another backend's
    /// lookup goes through at once.
    #[tokio::test]
    async fn a_backend_with_stuck_lookups_leaves_the_rest_to_the_others() {
        static SLOTS: Semaphore = Semaphore::const_new(LOOKUP_SLOTS);
        let stuck_backend = Arc::new(Semaphore::new(BACKEND_LOOKUP_SLOTS));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let stuck = Arc::new(std::sync::Mutex::new(stuck));
        let mut calls = Vec::new();
        for _ in 0..LOOKUP_SLOTS {
            let (own, stuck) = (stuck_backend.clone(), stuck.clone());
            calls.push(tokio::spawn(async move {
                lookup(&own, &SLOTS, move || {
                    let _ = stuck.lock().map(|rx| rx.recv());
                    Ok(Vec::new())
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = Arc::new(Semaphore::new(BACKEND_LOOKUP_SLOTS));
        let addrs = tokio::time::timeout(
            Duration::from_secs(2),
            lookup(&other, &SLOTS, || {
                Ok(vec![SocketAddr::from(([127, 0, 0, 1], 2))])
            }),
        )
        .await
        .expect("another backend's lookup is not queued behind the stuck ones")
        .expect("resolved");
        assert_eq!(addrs, vec![SocketAddr::from(([127, 0, 0, 1], 2))]);
        for _ in 0..LOOKUP_SLOTS {
            let _ = release.send(());
        }
        for call in calls {
            call.abort();
        }
    }
}
