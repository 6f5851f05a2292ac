//! Whether a spliced session is still worth its place: bytes moved either way within the idle
//! timeout, and no write to either peer blocked longer than the send timeout.
//!
//! The copies note what they do on shared counters ([`Traffic`], through [`Metered`] streams:
//! an atomic add per read or write call, no clock read, no timer reset). A look every
//! [`Watch::period`] compares them with the previous look's ([`Watch::check`], a pure function
//! of what it is shown and when). A change is seen at most a period after it happened, and a
//! deadline passed at most a period before the look that finds it, so a session is ended
//! within two periods after its deadline, never before it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Default bound on a session with no bytes either way: long enough for any application that
/// keeps its WebSockets alive with pings (Socket.IO every 25 s, SignalR every 15 s, browsers
/// and servers commonly every 30 to 60 s) and for one that is merely quiet for a while, short
/// enough that sessions whose peers vanished without a FIN (a laptop closed, a NAT entry
/// expired) give back their place within the hour.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Looks per deadline (the shorter one): a session is ended within half of it past it.
const LOOKS_PER_DEADLINE: u32 = 4;

/// Shortest time between looks, however short the deadlines.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How long a spliced session may go without traffic, and a write in it stay blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// No bytes either way for this long ends the session; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// A write to either peer blocked this long (the peer reads nothing of what it is sent)
    /// ends the session.
    pub send_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            // The listener's default send timeout (nginx's `send_timeout`).
            send_timeout: Duration::from_secs(60),
        }
    }
}

/// One end of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    Client = 0,
    Backend = 1,
}

/// Why a session was ended before either peer ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// No bytes either way for the idle timeout.
    Idle,
    /// This peer read nothing it was sent for the send timeout.
    Unread(Peer),
}

impl Ended {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Unread(Peer::Client) => "client not reading",
            Self::Unread(Peer::Backend) => "backend not reading",
        }
    }
}

/// What the copies of one session have done, written by them and read by its watch.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    /// Reads that returned bytes, from either peer.
    reads: AtomicU64,
    /// Writes to each peer that completed.
    writes: [AtomicU64; 2],
    /// Whether the last write to each peer was left pending.
    blocked: [AtomicBool; 2],
}

impl Traffic {
    fn seen(&self) -> Seen {
        let load = |i: usize| {
            (
                self.writes[i].load(Ordering::Relaxed),
                self.blocked[i].load(Ordering::Relaxed),
            )
        };
        Seen {
            reads: self.reads.load(Ordering::Relaxed),
            writes: [load(0), load(1)],
        }
    }

    fn read<T>(&self, result: &Poll<io::Result<T>>, got_bytes: bool) {
        if got_bytes && matches!(result, Poll::Ready(Ok(_))) {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn wrote<T>(&self, peer: Peer, result: &Poll<T>) {
        let i = peer as usize;
        let pending = result.is_pending();
        if !pending {
            self.writes[i].fetch_add(1, Ordering::Relaxed);
        }
        if self.blocked[i].load(Ordering::Relaxed) != pending {
            self.blocked[i].store(pending, Ordering::Relaxed);
        }
    }
}

/// The counters as one look saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    reads: u64,
    /// Per peer: writes completed, and whether the last one was left pending.
    writes: [(u64, bool); 2],
}

/// The looks of one session: what the last one saw and since when nothing has changed.
#[derive(Debug)]
pub(crate) struct Watch {
    limits: SessionLimits,
    reads: u64,
    quiet_since: Instant,
    /// Per peer, while a write to it is pending: the writes completed when that was first
    /// seen, and when.
    blocked: [Option<(u64, Instant)>; 2],
}

impl Watch {
    pub(crate) fn new(limits: SessionLimits, now: Instant) -> Self {
        Self {
            limits,
            reads: 0,
            quiet_since: now,
            blocked: [None, None],
        }
    }

    /// Time between looks.
    pub(crate) fn period(&self) -> Duration {
        let shortest = self
            .limits
            .idle_timeout
            .map_or(self.limits.send_timeout, |idle| {
                idle.min(self.limits.send_timeout)
            });
        (shortest / LOOKS_PER_DEADLINE).max(MIN_PERIOD)
    }

    /// Looks at `traffic` at `now`: whether the session must end. A write still pending with
    /// no write completed since it was first seen pending has been blocked all along (a copy
    /// polls its pending write again, never another).
    fn check(&mut self, seen: Seen, now: Instant) -> Option<Ended> {
        if seen.reads != self.reads {
            self.reads = seen.reads;
            self.quiet_since = now;
        }
        for (i, peer) in [Peer::Client, Peer::Backend].into_iter().enumerate() {
            let (writes, pending) = seen.writes[i];
            self.blocked[i] = match self.blocked[i] {
                _ if !pending => None,
                Some((before, since)) if before == writes => {
                    if now.duration_since(since) >= self.limits.send_timeout {
                        return Some(Ended::Unread(peer));
                    }
                    Some((before, since))
                }
                _ => Some((writes, now)),
            };
        }
        self.limits
            .idle_timeout
            .filter(|&idle| now.duration_since(self.quiet_since) >= idle)
            .map(|_| Ended::Idle)
    }
}

/// Resolves once `traffic` shows the session past one of its `limits`; pending forever when
/// it never does.
pub(crate) async fn watch(traffic: &Traffic, limits: SessionLimits) -> Ended {
    let now = Instant::now();
    let mut watch = Watch::new(limits, now);
    let period = watch.period();
    let mut looks = tokio::time::interval_at(now + period, period);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = looks.tick().await;
        if let Some(ended) = watch.check(traffic.seen(), now) {
            return ended;
        }
    }
}

/// One peer's stream, noting on the session's [`Traffic`] what its reads and writes do.
pub(crate) struct Metered<'a, Io> {
    io: Io,
    traffic: &'a Traffic,
    peer: Peer,
}

impl<'a, Io> Metered<'a, Io> {
    pub(crate) fn new(io: Io, traffic: &'a Traffic, peer: Peer) -> Self {
        Self { io, traffic, peer }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Metered<'_, Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        self.traffic.read(&result, buf.filled().len() > before);
        result
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Metered<'_, Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.traffic.wrote(self.peer, &result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.traffic.wrote(self.peer, &result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.traffic.wrote(self.peer, &result);
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn limits(idle: Option<u64>, send: u64) -> SessionLimits {
        SessionLimits {
            idle_timeout: idle.map(Duration::from_secs),
            send_timeout: Duration::from_secs(send),
        }
    }

    fn seen(reads: u64, client: (u64, bool), backend: (u64, bool)) -> Seen {
        Seen {
            reads,
            writes: [client, backend],
        }
    }

    #[test]
    fn a_session_with_no_bytes_either_way_ends_at_the_idle_timeout_and_not_before() {
        let start = Instant::now();
        let mut watch = Watch::new(limits(Some(10), 60), start);
        assert_eq!(watch.period(), Duration::from_millis(2500));
        let quiet = seen(0, (0, false), (0, false));
        assert_eq!(watch.check(quiet, start + 9 * SECOND), None);
        assert_eq!(watch.check(quiet, start + 10 * SECOND), Some(Ended::Idle));
    }

    #[test]
    fn any_read_puts_the_idle_deadline_back() {
        let start = Instant::now();
        let mut watch = Watch::new(limits(Some(10), 60), start);
        assert_eq!(
            watch.check(seen(1, (1, false), (0, false)), start + 8 * SECOND),
            None
        );
        assert_eq!(
            watch.check(seen(1, (1, false), (0, false)), start + 17 * SECOND),
            None
        );
        assert_eq!(
            watch.check(seen(1, (1, false), (0, false)), start + 18 * SECOND),
            Some(Ended::Idle)
        );
    }

    #[test]
    fn no_idle_timeout_never_ends_a_quiet_session() {
        let start = Instant::now();
        let mut watch = Watch::new(limits(None, 60), start);
        assert_eq!(watch.period(), Duration::from_secs(15));
        let quiet = seen(0, (0, false), (0, false));
        assert_eq!(watch.check(quiet, start + 100_000 * SECOND), None);
    }

    #[test]
    fn a_write_blocked_for_the_send_timeout_ends_the_session() {
        let start = Instant::now();
        let mut watch = Watch::new(limits(None, 60), start);
        // First seen pending 15 s in; still pending with no write since, 60 s after that.
        let stuck = seen(5, (3, true), (0, false));
        assert_eq!(watch.check(stuck, start + 15 * SECOND), None);
        assert_eq!(watch.check(stuck, start + 74 * SECOND), None);
        assert_eq!(
            watch.check(stuck, start + 75 * SECOND),
            Some(Ended::Unread(Peer::Client))
        );
    }

    #[test]
    fn a_write_that_completes_between_looks_starts_the_send_timeout_again() {
        let start = Instant::now();
        let mut watch = Watch::new(limits(None, 60), start);
        assert_eq!(watch.check(seen(0, (0, false), (3, true)), start), None);
        // Pending again at every look, but writes keep completing in between: a slow reader.
        for n in 1..10u64 {
            let at = start + SECOND * 30 * n as u32;
            assert_eq!(watch.check(seen(n, (0, false), (3 + n, true)), at), None);
        }
        // Not pending at a look forgets the block too.
        assert_eq!(
            watch.check(seen(9, (0, false), (12, false)), start + 300 * SECOND),
            None
        );
        assert_eq!(
            watch.check(seen(9, (0, false), (12, true)), start + 301 * SECOND),
            None
        );
        assert_eq!(
            watch.check(seen(9, (0, false), (12, true)), start + 361 * SECOND),
            Some(Ended::Unread(Peer::Backend))
        );
    }
}
