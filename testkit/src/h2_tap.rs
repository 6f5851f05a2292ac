//! A TCP relay in front of an HTTP/2 server that notes the frames each client sends through
//! it, for tests that care what a client puts on the wire (its pings) rather than what the
//! server makes of it. Bytes pass through unchanged, both ways.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The HTTP/2 connection preface a client sends before its first frame (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame type of PING (RFC 9113 §6.7), and its ACK flag.
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

/// A frame header a client sent, and when the relay read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub at: Instant,
}

impl Frame {
    /// A PING the client sent of its own accord, not its answer to the server's.
    pub fn is_ping(&self) -> bool {
        self.kind == PING && self.flags & ACK == 0
    }
}

/// The relay; it stops accepting when dropped.
#[derive(Debug)]
pub struct H2Tap {
    addr: SocketAddr,
    frames: Arc<Mutex<Vec<Frame>>>,
    accept: JoinHandle<()>,
}

impl H2Tap {
    /// A relay on 127.0.0.1 to the HTTP/2 server at `server`, one connection to it for each
    /// client connection.
    pub async fn spawn(server: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let frames = Arc::new(Mutex::new(Vec::new()));
        let noted = Arc::clone(&frames);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, server, Arc::clone(&noted)));
            }
        });
        Ok(Self {
            addr,
            frames,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every frame clients have sent so far, in the order read.
    pub fn frames(&self) -> Vec<Frame> {
        self.frames.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// When clients sent their own PINGs, in order.
    pub fn pings(&self) -> Vec<Instant> {
        self.frames()
            .iter()
            .filter(|f| f.is_ping())
            .map(|f| f.at)
            .collect()
    }
}

impl Drop for H2Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(client: TcpStream, server: SocketAddr, frames: Arc<Mutex<Vec<Frame>>>) {
    let Ok(upstream) = TcpStream::connect(server).await else {
        return;
    };
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = upstream.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        let _ = client_tx.shutdown().await;
    });
    let mut reader = FrameReader::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let at = Instant::now();
        let read = reader.push(&buf[..n]);
        if let Ok(mut frames) = frames.lock() {
            frames.extend(read.into_iter().map(|(kind, flags, stream)| Frame {
                kind,
                flags,
                stream,
                at,
            }));
        }
        if server_tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = server_tx.shutdown().await;
    let _ = answers.await;
}

/// Splits a client's bytes into frame headers, whatever the reads' boundaries.
#[derive(Debug, Default)]
struct FrameReader {
    /// Bytes of the preface already passed.
    preface: usize,
    pending: Vec<u8>,
}

impl FrameReader {
    /// The (type, flags, stream) of each frame that `bytes` completes.
    fn push(&mut self, mut bytes: &[u8]) -> Vec<(u8, u8, u32)> {
        if self.preface < PREFACE.len() {
            let n = bytes.len().min(PREFACE.len() - self.preface);
            self.preface += n;
            bytes = &bytes[n..];
        }
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(head) = self.pending.get(..9) {
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            if self.pending.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            frames.push((head[3], head[4], stream));
            self.pending.drain(..9 + len);
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_across_reads_after_the_preface() {
        let mut wire = PREFACE.to_vec();
        // SETTINGS (empty), a PING, a PING ACK, HEADERS on stream 1 with 3 bytes.
        wire.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        wire.extend_from_slice(&[0, 0, 8, PING, 0, 0, 0, 0, 0]);
        wire.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        wire.extend_from_slice(&[0, 0, 8, PING, ACK, 0, 0, 0, 0]);
        wire.extend_from_slice(&[8; 8]);
        wire.extend_from_slice(&[0, 0, 3, 0x1, 0x4, 0, 0, 0, 1, 9, 9, 9]);
        let mut reader = FrameReader::default();
        let mut frames = Vec::new();
        for chunk in wire.chunks(5) {
            frames.extend(reader.push(chunk));
        }
        assert_eq!(
            frames,
            vec![(0x4, 0, 0), (PING, 0, 0), (PING, ACK, 0), (0x1, 0x4, 1)]
        );
    }
}
