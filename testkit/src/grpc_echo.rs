//! A Rust stand-in for the Gateway API conformance gRPC echo (`echo-basic` run with
//! `GRPC_ECHO_SERVER` set): the service `gateway_api_conformance.echo_basic.grpcecho.GrpcEcho`
//! over cleartext HTTP/2 with prior knowledge, on one port.
//!
//! - `Echo` and `EchoTwo` answer OK with an [`proto::EchoResponse`]: the fully qualified name
//!   of the method that ran, the request metadata and `:authority` as received (see
//!   [`handler`] for which headers count as metadata), and the pod's namespace and name.
//! - `EchoThree` answers UNIMPLEMENTED (`method EchoThree not implemented`), and so does any
//!   other method or service.
//! - As grpc-go's server: a request that is not a POST gets HTTP 405, one without a gRPC
//!   `content-type` HTTP 415; a connection that does not open with the HTTP/2 preface is
//!   closed; a stream carrying a connection-specific header (`connection`, ...) is reset
//!   (hyper's HTTP/2 server refuses them, as grpc-go's does).
//!
//! [`client`] is a unary client that behaves as grpc-go's does where the conformance suite's
//! verdicts depend on it (how a response becomes a status code, the default `:authority`).
//!
//! [`GrpcEchoServer::bind_tls`] serves the same over TLS (HTTP/2 by ALPN `h2`), for proxies
//! that dial their backends over TLS; its `tls_assertions` are not filled in.
//!
//! Not implemented: server reflection, and the log line
//! per call (`Received over plaintext: ...`), which nothing reads.

pub mod client;
mod handler;
pub mod proto;

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::echo::EchoIdentity;

/// A running gRPC echo. Dropping it stops the listener and every connection.
pub struct GrpcEchoServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl GrpcEchoServer {
    /// Listens on `ip:0` and serves until dropped or [`GrpcEchoServer::shutdown`], answering
    /// as the pod `identity`.
    ///
    /// Must be called inside a tokio runtime.
    pub async fn spawn(ip: IpAddr, identity: EchoIdentity) -> io::Result<Self> {
        Self::bind(SocketAddr::new(ip, 0), identity).await
    }

    /// Listens on `addr` (port 0 picks one) and serves.
    pub async fn bind(addr: SocketAddr, identity: EchoIdentity) -> io::Result<Self> {
        Self::bind_with(addr, identity, None).await
    }

    /// [`GrpcEchoServer::bind`] over TLS with `tls` (its certificate and client-certificate
    /// policy; its ALPN protocols are replaced by `h2`). A handshake that fails closes the
    /// connection.
    pub async fn bind_tls(
        addr: SocketAddr,
        identity: EchoIdentity,
        tls: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        let mut tls = Arc::unwrap_or_clone(tls);
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        Self::bind_with(addr, identity, Some(acceptor)).await
    }

    async fn bind_with(
        addr: SocketAddr,
        identity: EchoIdentity,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, Arc::new(identity), tls, stop_rx));
        Ok(Self {
            addr,
            stop,
            task: Some(task),
        })
    }

    /// The address the echo serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection (calls in flight are dropped) and waits for
    /// the server's tasks to end.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for GrpcEchoServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    identity: Arc<EchoIdentity>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _remote)) = accepted else {
            // Usually EMFILE or a connection reset before accept: pause, keep serving.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let identity = identity.clone();
        match tls.clone() {
            None => conns.spawn(serve_connection(stream, identity)),
            Some(acceptor) => conns.spawn(async move {
                if let Ok(stream) = acceptor.accept(stream).await {
                    serve_connection(stream, identity).await;
                }
            }),
        };
    }
    conns.shutdown().await;
}

/// Serves one connection as HTTP/2 with prior knowledge; anything else fails the preface and
/// ends the connection.
async fn serve_connection<S>(stream: S, identity: Arc<EchoIdentity>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let identity = identity.clone();
        async move { Ok::<_, Infallible>(handler::handle(req, &identity).await) }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}
