//! HTTP clients for tests: pooled ones, as an eyeball or a caller of the proxy uses them,
//! and single connections driven by a task of their own, for tests that care which
//! connection a request takes or when it ends.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use hyper::client::conn::{http1, http2};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::task::JoinHandle;

/// A pooled client over plain TCP; `B` is the request body.
pub type Pooled<B> = Client<HttpConnector, B>;

/// A pooled client speaking HTTP/1.1.
pub fn pooled<B>() -> Pooled<B>
where
    B: http_body::Body<Data = Bytes> + Send + 'static + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// `GET path` from `addr` with a `Host` header: the status and the body read as JSON (`null`
/// when it is not JSON, as a proxy's own error answers are not).
///
/// # Panics
/// When `addr` does not answer.
pub async fn get_json(addr: SocketAddr, host: &str, path: &str) -> (u16, serde_json::Value) {
    use http_body_util::{BodyExt, Empty};
    let request = http::Request::get(format!("http://{addr}{path}"))
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = pooled().request(request).await.expect("the server answers");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// A pooled client speaking only HTTP/2 with prior knowledge (h2c).
pub fn pooled_h2c<B>() -> Pooled<B>
where
    B: http_body::Body<Data = Bytes> + Send + 'static + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// One HTTP/1.1 connection to `addr`, driven (upgrades included) by the task returned with
/// it, which ends when the connection does.
pub async fn connect_http1<B>(
    addr: SocketAddr,
) -> io::Result<(http1::SendRequest<B>, JoinHandle<()>)>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (sender, conn) = http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(io::Error::other)?;
    let task = tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok((sender, task))
}

/// One HTTP/2 connection with prior knowledge (h2c) to `addr`, driven by the task returned
/// with it, which ends when the connection does.
pub async fn connect_h2c<B>(addr: SocketAddr) -> io::Result<(http2::SendRequest<B>, JoinHandle<()>)>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .map_err(io::Error::other)?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, task))
}
