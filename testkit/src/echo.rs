//! A Rust stand-in for the Gateway API conformance echo server (`echo-basic`).
//!
//! Two listeners: the HTTP port serves HTTP/1.1 (and HTTP/2 with prior knowledge), the h2c
//! port serves only HTTP/2 with prior knowledge and answers anything else with 400
//! `Expected h2c request`. Every other route echoes the request as JSON (`path`, `host`,
//! `method`, `proto`, `headers`, `namespace`, `pod`, `httpPort`, `ingress`, `service`, `sni`),
//! indented like Go's `json.MarshalIndent(v, "", " ")`, honours
//! `X-Echo-Set-Header` and `?delay=`, and logs `Echoing back request made to <RequestURI> to
//! client (<remote addr>)`. Special routes: `/health`, `/status/NNN`, `/ws` (WebSocket echo)
//! and `/retry/...` (per-UUID failure simulator, by status code or TCP RST).
//!
//! A TLS port ([`EchoServer::start_tls`]) serves the same routes over TLS (HTTP/1.1, or HTTP/2
//! by ALPN) and echoes the session as echo-basic does: `sni`, and `tls` with the version, the
//! SNI, the ALPN protocol, the cipher suite and the client's certificates as PEM. Whether it
//! asks for (or requires) a client certificate is the given server config's choice.
//!
//! Not implemented: the `Upgrade: h2c` path of the h2c port.

mod conn_io;
mod go_duration;
mod handler;
mod request_log;
mod response;
mod websocket;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use conn_io::{ConnControl, ConnIo};
use handler::{ConnCtx, RetryCounters};
use request_log::RequestLog;

pub use go_duration::{parse as parse_go_duration, InvalidDuration};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// How long the h2c port waits for the first bytes of a connection.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines waiting to be written to stdout by the binary.
const PRINT_QUEUE: usize = 4096;

/// Which pod the echo server pretends to be (echo-basic's `NAMESPACE` and `POD_NAME`).
#[derive(Clone, Debug)]
pub struct EchoIdentity {
    /// Echoed as `namespace`.
    pub namespace: String,
    /// Echoed as `pod`; conformance checks match it by prefix against the service name.
    pub pod: String,
}

/// Everything [`EchoServer::start`] needs.
#[derive(Clone, Debug)]
pub struct EchoConfig {
    /// Address of the HTTP/1.1 (+ HTTP/2 prior knowledge) listener; port 0 picks one.
    pub http_addr: SocketAddr,
    /// Address of the h2c-only listener; port 0 picks one.
    pub h2c_addr: SocketAddr,
    /// Namespace and pod name to echo.
    pub identity: EchoIdentity,
    /// Keep the request log in memory for [`EchoServer::log_lines`] and
    /// [`EchoServer::count_echoed`] (bounded: the newest 100 000 lines).
    pub record_log: bool,
    /// Also write each log line to stdout, as echo-basic does.
    pub print_log: bool,
}

/// A running echo server. Dropping it stops both listeners and all connections.
pub struct EchoServer {
    http_addr: SocketAddr,
    h2c_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// State shared by all connections of one server.
pub(crate) struct Shared {
    identity: EchoIdentity,
    http_port: String,
    log: Option<RequestLog>,
    printer: Option<mpsc::Sender<String>>,
    retries: RetryCounters,
}

impl Shared {
    async fn log(&self, request_uri: &str, remote: SocketAddr) {
        if self.log.is_none() && self.printer.is_none() {
            return;
        }
        let line = request_log::line(request_uri, remote);
        if let Some(printer) = &self.printer {
            // Back-pressure instead of an unbounded queue; a closed printer just drops lines.
            let _ = printer.send(line.clone()).await;
        }
        if let Some(log) = &self.log {
            log.record(line, request_uri);
        }
    }
}

#[derive(Clone)]
enum Port {
    Http,
    H2c,
    Tls(tokio_rustls::TlsAcceptor),
}

impl EchoServer {
    /// Binds HTTP/1.1 (+ HTTP/2 prior knowledge) on `ip:0` and an h2c-only listener on `ip:0`,
    /// and serves until dropped or [`EchoServer::shutdown`]. The request log is kept in memory.
    ///
    /// Must be called inside a tokio runtime.
    pub async fn spawn(ip: IpAddr, id: EchoIdentity) -> std::io::Result<EchoServer> {
        Self::start(EchoConfig {
            http_addr: SocketAddr::new(ip, 0),
            h2c_addr: SocketAddr::new(ip, 0),
            identity: id,
            record_log: true,
            print_log: false,
        })
        .await
    }

    /// Binds both listeners as configured and starts serving.
    pub async fn start(config: EchoConfig) -> std::io::Result<EchoServer> {
        Self::start_with(config, None).await
    }

    /// [`EchoServer::start`], plus a TLS listener on `config.http_addr`'s IP, port 0, with the
    /// server config given (its certificate, ALPN and client-certificate policy; without ALPN
    /// protocols it offers `h2` and `http/1.1`). A handshake that fails closes the connection.
    pub async fn start_tls(
        config: EchoConfig,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<EchoServer> {
        Self::start_with(config, Some(tls)).await
    }

    async fn start_with(
        config: EchoConfig,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<EchoServer> {
        let tls_listener = match &tls {
            Some(_) => Some(TcpListener::bind(SocketAddr::new(config.http_addr.ip(), 0)).await?),
            None => None,
        };
        let tls_addr = tls_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let http = TcpListener::bind(config.http_addr).await?;
        let h2c = TcpListener::bind(config.h2c_addr).await?;
        let http_addr = http.local_addr()?;
        let h2c_addr = h2c.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        let printer = if config.print_log {
            let (tx, rx) = mpsc::channel(PRINT_QUEUE);
            tasks.push(tokio::spawn(print_lines(rx)));
            Some(tx)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            identity: config.identity,
            http_port: http_addr.port().to_string(),
            log: config.record_log.then(RequestLog::default),
            printer,
            retries: RetryCounters::default(),
        });
        tasks.push(tokio::spawn(accept_loop(
            http,
            Port::Http,
            shared.clone(),
            stop_rx.clone(),
        )));
        if let (Some(listener), Some(tls)) = (tls_listener, tls) {
            let mut tls = Arc::unwrap_or_clone(tls);
            if tls.alpn_protocols.is_empty() {
                tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            }
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            tasks.push(tokio::spawn(accept_loop(
                listener,
                Port::Tls(acceptor),
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(accept_loop(
            h2c,
            Port::H2c,
            shared.clone(),
            stop_rx,
        )));
        Ok(EchoServer {
            http_addr,
            h2c_addr,
            tls_addr,
            shared,
            stop,
            tasks,
        })
    }

    /// Address of the HTTP/1.1 listener.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Address of the h2c-only listener.
    pub fn h2c_addr(&self) -> SocketAddr {
        self.h2c_addr
    }

    /// Address of the TLS listener, when started with [`EchoServer::start_tls`].
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Every `Echoing back request made to <RequestURI> to client (<remote addr>)` line so
    /// far, oldest first (the newest 100 000 are kept). Empty when the log is not recorded.
    pub fn log_lines(&self) -> Vec<String> {
        self.shared
            .log
            .as_ref()
            .map(RequestLog::lines)
            .unwrap_or_default()
    }

    /// Number of requests echoed so far whose RequestURI equals `uri` (path + `?` + raw query,
    /// as received).
    pub fn count_echoed(&self, uri: &str) -> usize {
        self.shared.log.as_ref().map_or(0, |log| log.count(uri))
    }

    /// Stops accepting, closes every connection (in-flight requests are dropped) and waits
    /// for the server tasks to finish.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn print_lines(mut rx: mpsc::Receiver<String>) {
    let mut out = tokio::io::BufWriter::new(tokio::io::stdout());
    while let Some(line) = rx.recv().await {
        let _ = out.write_all(line.as_bytes()).await;
        let _ = out.write_all(b"\n").await;
        // Flush once the queue is drained so lines show up promptly without a write per line
        // under load.
        if rx.is_empty() {
            let _ = out.flush().await;
        }
    }
    let _ = out.flush().await;
}

async fn accept_loop(
    listener: TcpListener,
    port: Port,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(_) => {
                // Usually EMFILE or a connection reset before accept: pause, keep serving.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = ConnCtx {
            shared: shared.clone(),
            remote,
            control: Arc::new(ConnControl::default()),
            stop: stop.clone(),
            tls: None,
        };
        conns.spawn(serve_connection(stream, port.clone(), ctx));
    }
    conns.shutdown().await;
}

async fn serve_connection(stream: TcpStream, port: Port, ctx: ConnCtx) {
    let mut stop = ctx.stop.clone();
    let control = ctx.control.clone();
    let serve = async move {
        match port {
            Port::Http => serve_http(stream, ctx).await,
            Port::H2c => serve_h2c(stream, ctx).await,
            Port::Tls(acceptor) => serve_tls(stream, &acceptor, ctx).await,
        }
    };
    tokio::select! {
        _ = serve => {}
        _ = stop.changed() => {}
        // Dropping `serve` drops the socket, which sends the RST (see ConnIo's Drop).
        _ = control.aborted() => {}
    }
}

fn echo_service(
    ctx: ConnCtx,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = response::EchoResponse,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<response::EchoResponse, Infallible>> + Send,
> + Clone {
    let ctx = Arc::new(ctx);
    service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(handler::handle(req, &ctx).await) }
    })
}

async fn serve_http(stream: TcpStream, ctx: ConnCtx) {
    let io = TokioIo::new(ConnIo::new(Bytes::new(), stream, ctx.control.clone()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Go writes canonical header names; title case is the closest hyper offers.
    builder.http1().title_case_headers(true);
    let _ = builder
        .serve_connection_with_upgrades(io, echo_service(ctx))
        .await;
}

async fn serve_tls(stream: TcpStream, acceptor: &tokio_rustls::TlsAcceptor, mut ctx: ConnCtx) {
    let io = ConnIo::new(Bytes::new(), stream, ctx.control.clone());
    let Ok(Ok(tls)) = tokio::time::timeout(SNIFF_TIMEOUT, acceptor.accept(io)).await else {
        return;
    };
    let (_, session) = tls.get_ref();
    ctx.tls = Some(handler::TlsInfo {
        version: match session.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        },
        server_name: session.server_name().unwrap_or_default().to_owned(),
        negotiated_protocol: session
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default(),
        cipher_suite: session
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
            .unwrap_or_default(),
        peer_certificates: session
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| crate::pki::encode_pem("CERTIFICATE", c))
            .collect(),
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().title_case_headers(true);
    let _ = builder
        .serve_connection_with_upgrades(TokioIo::new(tls), echo_service(ctx))
        .await;
}

async fn serve_h2c(mut stream: TcpStream, ctx: ConnCtx) {
    let mut prefix = BytesMut::with_capacity(H2_PREFACE.len());
    let is_h2 = tokio::time::timeout(SNIFF_TIMEOUT, async {
        while prefix.len() < H2_PREFACE.len() {
            let mut chunk = [0u8; 24];
            let want = H2_PREFACE.len() - prefix.len();
            let n = stream.read(&mut chunk[..want]).await.ok()?;
            if n == 0 {
                return None;
            }
            prefix.extend_from_slice(&chunk[..n]);
            if !H2_PREFACE.starts_with(&prefix) {
                return Some(false);
            }
        }
        Some(true)
    })
    .await;
    let is_h2 = match is_h2 {
        Ok(Some(is_h2)) => is_h2,
        _ => return,
    };
    let io = TokioIo::new(ConnIo::new(prefix.freeze(), stream, ctx.control.clone()));
    if is_h2 {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, echo_service(ctx))
            .await;
    } else {
        let reject = service_fn(|_req| async {
            Ok::<_, Infallible>(response::text(
                http::StatusCode::BAD_REQUEST,
                "Expected h2c request",
            ))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, reject)
            .await;
    }
}
