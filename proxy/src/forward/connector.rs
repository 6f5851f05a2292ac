//! Dials one fixed backend, whatever the request URI says, optionally over TLS.

use super::tls::TlsTarget;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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
    /// Dial only public addresses of `host` (see [`is_public`]).
    public_only: bool,
    /// This backend's share of the process's [`LOOKUPS`].
    lookups: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, Clone)]
pub(crate) struct Connector {
    target: Arc<Target>,
}

impl Connector {
    /// A connector to `host:port`; with `public_only`, only public addresses of `host` are
    /// dialled, checked at each dial.
    pub(crate) fn new(
        host: &str,
        port: u16,
        tls: Option<TlsTarget>,
        timeout: Duration,
        public_only: bool,
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
    let tcp = tokio::time::timeout(t.timeout, dial(t))
        .await
        .map_err(|_| err(ConnectErrorKind::Timeout, "connect timed out".into()))?
        .map_err(|e| err(ConnectErrorKind::Dial, e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(&tcp).set_tcp_keepalive(&crate::tcp_keepalive());
    let Some(tls) = &t.tls else {
        return Ok(Stream::Plain(tcp));
    };
    let handshake = tls.connector().connect(tls.server_name().clone(), tcp);
    let stream = tokio::time::timeout(t.timeout, handshake)
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
async fn dial(t: &Target) -> io::Result<TcpStream> {
    let addrs = resolve(&t.host, t.port, &t.lookups).await?;
    if !t.public_only {
        return TcpStream::connect(&addrs[..]).await;
    }
    let addrs: Vec<SocketAddr> = addrs.into_iter().filter(|a| is_public(a.ip())).collect();
    if addrs.is_empty() {
        tracing::debug!(
            host = %t.host,
            "backend refused: its addresses are not public (publicOnly)"
        );
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} resolves to no public address (publicOnly)", t.host),
        ));
    }
    TcpStream::connect(&addrs[..]).await
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

/// Whether `ip` is a public (global unicast) address: not loopback, private, link-local,
/// CGNAT, multicast, reserved or unspecified, nor an IPv6 form that reaches an IPv4 address
/// (mapped, compatible, SIIT, NAT64, 6to4) unless that address is public, nor a prefix that
/// tunnels or translates to places this check cannot see (local-use NAT64, Teredo).
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // this network
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // CGNAT, 100.64/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 168) // private
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18/15
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: [u16; 2]| Ipv4Addr::from((u32::from(hi[0]) << 16) | u32::from(hi[1]));
    // ::a.b.c.d (compatible, also `::` and `::1`) and ::ffff:a.b.c.d (mapped).
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // SIIT, ::ffff:0:a.b.c.d.
    if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // NAT64, 64:ff9b::/96: the translator dials the embedded IPv4 address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded([s[6], s[7]]));
    }
    // 6to4, 2002:a.b.c.d::/48: relayed to the embedded IPv4 address.
    if s[0] == 0x2002 {
        return is_public_v4(embedded([s[1], s[2]]));
    }
    !((s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64, 64:ff9b:1::/48
        || (s[0] == 0x2001 && s[1] == 0) // Teredo, 2001::/32
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated, still routed inside sites), fec0::/10
        || (s[0] & 0xff00) == 0xff00) // multicast, ff00::/8
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
    use super::{is_public, lookup, BACKEND_LOOKUP_SLOTS, LOOKUP_SLOTS};
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::Semaphore;

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

    fn public(ip: &str) -> bool {
        is_public(ip.parse::<IpAddr>().expect("test address parses"))
    }

    #[test]
    fn only_global_unicast_addresses_are_public() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.1.2.3",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            // IPv4-mapped, IPv4-compatible and NAT64 forms reach the IPv4 address they embed.
            "::ffff:127.0.0.1",
            "::ffff:10.96.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::192.168.0.1",
            // SIIT and 6to4 forms of private addresses, and prefixes that lead past the check.
            "::ffff:0:10.0.0.1",
            "::ffff:0:169.254.169.254",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
            "feff::1",
        ] {
            assert!(!public(ip), "{ip} is not public");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.255.255",
            "169.255.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "192.167.255.255",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "fbff::1",
            "::ffff:0:8.8.8.8",
            "2002:808:808::1",
            "2001:1::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(public(ip), "{ip} is public");
        }
    }
}
