//! The standalone data listener: HTTP/1.1 and h2c on one port, client limits, graceful drain.
//!
//! At most [`Limits::max_connections`] client connections are open at once: at the limit the
//! listener stops accepting until one closes, so a flood waits in the kernel's backlog (and is
//! refused beyond it) instead of taking file descriptors and memory without bound.

use crate::proxy::{ConnInfo, Proxy};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// Default bound on client connections open at once on the data listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;

/// How often a listener held at its connection limit says so.
const LIMIT_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Limits that protect the proxy from slow or abusive clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client gets to send a complete request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// Most header lines in one HTTP/1.1 request.
    pub max_headers: usize,
    /// Largest request head (HTTP/1.1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Client connections open at once; at the limit, accepting pauses until one closes.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_headers: 100,
            max_header_bytes: 64 * 1024,
            max_concurrent_streams: 256,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Some(limits.header_read_timeout))
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes as u32)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    builder
}

/// Accepts connections until `stop` flips, then closes the listener (new connections are
/// refused) and returns the handle that tracks the connections still open.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let builder = builder(&limits);
    let permits = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut warned: Option<Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() >= LIMIT_WARN_INTERVAL) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        max = limits.max_connections,
                        "client connection limit reached: accepting paused until one closes"
                    );
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        // Never closed; a closed one could not admit anybody again.
                        Err(_) => break,
                    },
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let info = ConnInfo {
            peer: Some(peer),
            scheme: "http",
            trusted_forwarding: false,
        };
        let proxy = proxy.clone();
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
            async move { Ok::<_, Infallible>(proxy.handle(req, info).await) }
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            // Counted against the limit until the connection ends.
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with error");
            }
        });
    }
    drop(listener);
    graceful
}
