//! HA supervision against the mock edge, over real sockets: when connections
//! restart after failing, and what a connection does while every edge address is
//! taken.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::Protocol;
use tokio::time::Instant;

/// Own backoff of every connection: waits below 10 ms, 20 ms, ... 160 ms (5 retries).
const BACKOFF_BASE: Duration = Duration::from_millis(5);
/// Most a connection waits on its own backoff, 5 ms * 2^5.
const BACKOFF_MAX: Duration = Duration::from_millis(160);
/// Shared wait of the connections other than the first: below 4 s, 8 s, ... 64 s,
/// where the first connection waits milliseconds.
const HA_BACKOFF_BASE: Duration = Duration::from_secs(2);
/// Attempts of the first connection the test waits for: about 2.5 s of retries.
const FIRST_ATTEMPTS: usize = 16;
/// Most attempts each other connection may make meanwhile. Each one starts when a
/// shared timer runs out, and the timers run one after the other, so six attempts
/// within T need six jittered waits, drawn below 4, 8, 16, 32, 64 and 64 s, to add
/// up to less than T: for T = 5 s a chance below 5^6 / (6! * 2^26) < 4e-7. A
/// connection that restarted on its own backoff alone would keep pace with the
/// first, about 16 attempts.
const HELD_ATTEMPTS_MAX: usize = 5;
/// Slack for a loaded machine on the time an attempt takes before the next one
/// (handshake, refusal, QUIC's closing period of at most 1 s) on top of the
/// connection's own backoff.
const ATTEMPT_SLACK: Duration = Duration::from_millis(1500);
/// Longest, with slack, from a shared timer running out to the connection's
/// registration reaching the edge (QUIC handshake and the register call).
const DIAL: Duration = Duration::from_secs(1);
/// Longest, with slack, a connection takes after a refused attempt to wait for the
/// shared timer: closing the connection (QUIC's closing period, at most 1 s) and
/// its own backoff (at most 160 ms).
const SETTLE_AFTER_ATTEMPT: Duration = Duration::from_millis(1500);
/// Likewise after the edge closed its connection: noticing the close and a backoff
/// below 10 ms.
const SETTLE_AFTER_LOSS: Duration = Duration::from_millis(500);

/// When each connection index (0 to 2) tried to register with `edge`, from `since` on.
fn attempt_times(edge: &MockEdge, since: Instant) -> [Vec<Instant>; 3] {
    let mut times: [Vec<Instant>; 3] = Default::default();
    for r in edge.received_registrations() {
        if r.received_at >= since {
            if let Some(list) = times.get_mut(usize::from(r.record.conn_index)) {
                list.push(r.received_at);
            }
        }
    }
    times
}

/// Milliseconds since `start`, for failure messages.
fn ms(times: &[Instant], start: Instant) -> Vec<u128> {
    times.iter().map(|t| (*t - start).as_millis()).collect()
}

fn distance(a: Instant, b: Instant) -> Duration {
    a.saturating_duration_since(b)
        .max(b.saturating_duration_since(a))
}

/// Checks, for each attempt of one connection up to `until`, that the other
/// connection attempted within [`DIAL`] of it whenever the other must have been
/// waiting for the shared timer by then: it had settled after its previous attempt
/// (or after the loss at `lost`) before that timer can have run out. A connection
/// restarts when the timer it finds running ends, so both restart on that end; the
/// jitter can draw a timer too short for the other to reach, hence the condition.
fn assert_restarted_together(lost: Instant, until: Instant, one: &[Instant], two: &[Instant]) {
    for (mine, theirs) in [(one, two), (two, one)] {
        for &t in mine.iter().filter(|t| **t <= until) {
            let settled = match theirs.iter().rev().find(|p| **p + DIAL < t) {
                Some(p) => *p + SETTLE_AFTER_ATTEMPT,
                None => lost + SETTLE_AFTER_LOSS,
            };
            if settled + DIAL >= t {
                continue;
            }
            assert!(
                theirs.iter().any(|p| distance(*p, t) <= DIAL),
                "connections 1 and 2 restarted apart: {:?} and {:?} ms after the loss",
                ms(one, lost),
                ms(two, lost)
            );
        }
    }
}

/// Connections other than the first that fail together wait, after their own
/// backoff, for one shared timer and restart together when it ends; the first
/// connection restarts on its own short backoff alone, as in `cloudflared`'s
/// supervisor. The edge drops all three connections at once and then refuses every
/// registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_other_than_the_first_restart_together_on_a_shared_wait() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = MockEdge::start().await.unwrap();
        let mut opts = options(&edge, Protocol::Quic, 3);
        opts.backoff_base = BACKOFF_BASE;
        opts.ha_backoff_base = HA_BACKOFF_BASE;
        let (handle, _m, _r) = start_connector(opts, token());
        handle.wait_registered(3).await;
        edge.wait_serving(3).await;
        edge.set_registration_error(Some(retryable("server busy")));
        let lost = Instant::now();
        edge.close_connections();
        // The others' first restart comes within the first shared wait, below 4 s.
        wait_until(|| {
            let [first, one, two] = attempt_times(&edge, lost);
            first.len() >= FIRST_ATTEMPTS && !one.is_empty() && !two.is_empty()
        })
        .await;
        // Time for a partner's registration within `DIAL` of the last one counted.
        tokio::time::sleep(DIAL).await;
        let [first, one, two] = attempt_times(&edge, lost);
        let until = first[FIRST_ATTEMPTS - 1].max(one[0]).max(two[0]);

        let mut previous = lost;
        for t in &first[..FIRST_ATTEMPTS] {
            assert!(
                *t - previous <= BACKOFF_MAX + ATTEMPT_SLACK,
                "the first connection waited longer than its own backoff: {:?} ms after the loss",
                ms(&first, lost)
            );
            previous = *t;
        }
        for (idx, times) in [(1, &one), (2, &two)] {
            let held = times.iter().filter(|t| **t <= until).count();
            assert!(
                held <= HELD_ATTEMPTS_MAX,
                "connection {idx} made {held} attempts in {} ms while the first made \
                 {FIRST_ATTEMPTS}: {:?} ms after the loss",
                (until - lost).as_millis(),
                ms(times, lost)
            );
        }
        assert_restarted_together(lost, until, &one, &two);
        handle.shutdown().await;
        edge.shutdown().await;
    })
    .await
    .expect("test finished in time");
}

/// A TCP port on ::1 that is bound but not listening, so dials to it are refused
/// until it is released; `None` without IPv6 loopback.
fn refusing_ipv6_port() -> Option<(tokio::net::TcpSocket, SocketAddr)> {
    let socket = tokio::net::TcpSocket::new_v6().ok()?;
    socket.bind("[::1]:0".parse().ok()?).ok()?;
    let addr = socket.local_addr().ok()?;
    Some((socket, addr))
}

/// Static edges are split into two regions by position (even, odd), and a region
/// uses the IP family of its first entry until an IPv6 dial fails, then its other
/// family until an IPv4 dial fails. Here region 0 has two IPv6 entries and one
/// IPv4 entry, region 1 one IPv4 entry (and an IPv6 one it never uses), so three
/// connections start; the first one's IPv6 dial is refused, region 0 moves to
/// IPv4, and the third connection finds every address of the active families
/// taken. It waits, looking again, until the IPv4 edge of region 0 goes away and
/// its connection's failed dial moves the region back to IPv6, where an address is
/// free; the wait is not an attempt, so it registers with `numPreviousAttempts` 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_free_address_waits_for_one_without_counting_attempts() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let Some((refusing, v6)) = refusing_ipv6_port() else {
            eprintln!("skipped: no IPv6 loopback");
            return;
        };
        let region1 = MockEdge::start().await.unwrap();
        let pki = region1.pki().clone();
        let region0 = MockEdge::builder().pki(pki.clone()).start().await.unwrap();
        let mut opts = options(&region1, Protocol::Http2, 3);
        opts.edges = vec![
            v6.into(),
            region1.edge_addr().into(),
            v6.into(),
            v6.into(),
            region0.edge_addr().into(),
        ];
        opts.backoff_base = Duration::from_millis(20);
        let (handle, _m, _r) = start_connector(opts, token());
        handle.wait_registered(2).await;
        // The third connection starts 40 ms after the first registered and looks for
        // an address again after waits below 40 ms, 80 ms, ... 640 ms.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(handle.registered(), 2);
        let indexes = |edge: &MockEdge| -> Vec<(u8, u8)> {
            edge.registrations()
                .iter()
                .map(|r| (r.conn_index, r.num_previous_attempts))
                .collect()
        };
        let (on_region0, on_region1) = (indexes(&region0), indexes(&region1));
        let mut registered = [on_region0.clone(), on_region1.clone()].concat();
        registered.sort();
        assert_eq!(
            registered,
            [(0, 1), (1, 0)],
            "the first connection registered on IPv4 after its IPv6 dial failed, the \
             second on the other IPv4 edge, the third nowhere: {on_region0:?} {on_region1:?}"
        );
        let [(moved, _)] = on_region0[..] else {
            panic!("one connection registered on region 0's IPv4 edge: {on_region0:?}");
        };

        drop(refusing);
        let v6_edge = MockEdge::builder()
            .edge_addr(v6)
            .pki(pki)
            .start()
            .await
            .unwrap();
        region0.shutdown().await;
        tokio::time::timeout(Duration::from_secs(5), handle.wait_registered(3))
            .await
            .expect("the third connection registers once an address is free");
        v6_edge.wait_serving(2).await;
        let on_v6 = indexes(&v6_edge);
        assert!(
            on_v6.contains(&(2, 0)),
            "the third connection registers with numPreviousAttempts 0 after its waits: \
             (index, attempts) {on_v6:?}"
        );
        assert!(
            on_v6
                .iter()
                .any(|(idx, attempts)| *idx == moved && *attempts >= 1),
            "connection {moved} came over from region 0's IPv4 edge after a failed dial: {on_v6:?}"
        );
        assert!(!indexes(&region1).iter().any(|(idx, _)| *idx == 2));
        handle.shutdown().await;
        v6_edge.shutdown().await;
        region1.shutdown().await;
    })
    .await
    .expect("test finished in time");
}
