//! The standalone data listener: HTTP/1.1 and h2c on one port, client limits, graceful drain.

use crate::proxy::{ConnInfo, Proxy};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_headers: 100,
            max_header_bytes: 64 * 1024,
            max_concurrent_streams: 256,
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
    loop {
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
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with error");
            }
        });
    }
    drop(listener);
    graceful
}
