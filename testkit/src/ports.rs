//! Free TCP ports for a server that binds them later: a child process, or a server the test
//! starts by address rather than from a listener it already holds; and addresses that refuse
//! connections.

use std::net::SocketAddr;
use std::ops::Range;

/// Where ports are picked: below Linux's default ephemeral range (32768-60999).
const BELOW_EPHEMERAL: Range<u16> = 20_000..32_768;
/// Ports tried there before the kernel is asked for one.
const ATTEMPTS: u32 = 64;

/// A free TCP port on 127.0.0.1 for a child process (or another server) to bind.
///
/// The port is released before the child binds it, so another process could take it first,
/// which shows up as a start-up failure of the child. It is picked below the kernel's
/// ephemeral range, where neither outgoing connections (thousands a second under load, or
/// from tests running in parallel) nor other `bind(0)`s land: a port from `bind(0)` is one
/// any outgoing connection may be given before the child binds it. Only if none of the ports
/// tried below the range is free does the kernel pick one.
///
/// # Errors
///
/// The error of that last `bind(0)`, when even the kernel has no port to give.
pub fn free_port() -> std::io::Result<SocketAddr> {
    // A start that differs from process to process and call to call, so concurrent harnesses
    // and test processes do not try the same ports in the same order.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    let span = u32::from(BELOW_EPHEMERAL.end - BELOW_EPHEMERAL.start);
    for i in 0..ATTEMPTS {
        let offset = seed.wrapping_add(i.wrapping_mul(7_919)) % span;
        let port = BELOW_EPHEMERAL.start + u16::try_from(offset).unwrap_or(0);
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr();
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}

/// An address on 127.0.0.1 that refuses connections for as long as the returned socket is
/// held: bound, never listening. A port from a listener bound and dropped may be taken by
/// another test's listener before it is dialled, which then answers; this one cannot be.
///
/// # Errors
///
/// The socket's, when none can be made or bound.
pub fn refusing_addr() -> std::io::Result<(SocketAddr, tokio::net::TcpSocket)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    Ok((socket.local_addr()?, socket))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections to it are refused while it is held.
    #[tokio::test]
    async fn a_refusing_address_refuses() {
        let (addr, _held) = refusing_addr().expect("an address");
        let refused = tokio::net::TcpStream::connect(addr)
            .await
            .expect_err("refused");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // Nor can a listener take its port meanwhile.
        assert!(std::net::TcpListener::bind(addr).is_err(), "{addr} is held");
    }

    /// Ports for children come from below the ephemeral range, where outgoing connections do
    /// not take them between the pick and the child's bind; each is free when picked.
    #[test]
    fn free_ports_are_picked_below_the_ephemeral_range() {
        for _ in 0..20 {
            let addr = free_port().expect("a port");
            assert!(BELOW_EPHEMERAL.contains(&addr.port()), "{addr}");
            assert!(addr.ip().is_loopback(), "{addr}");
            std::net::TcpListener::bind(addr).expect("still free");
        }
    }
}
