//! A real proxy's config API, keeping each document pushed to it: a test reads what a
//! controller sent while the real proxy behind it serves it. Every request and answer goes
//! through unchanged.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::older_proxy::{forward, respond};

/// See the module docs.
#[derive(Debug)]
pub struct ConfigTap {
    addr: SocketAddr,
    documents: Arc<Mutex<Vec<Value>>>,
    task: JoinHandle<()>,
}

impl Drop for ConfigTap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConfigTap {
    /// Fronts the config API at `current` (a real proxy's admin address).
    pub async fn start(current: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let documents = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&documents);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let kept = Arc::clone(&kept);
                        async move { Ok::<_, Infallible>(answer(req, current, &kept).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            documents,
            task,
        })
    }

    /// Where its config API listens (the address a controller pushes to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The last document the proxy took (answered 2xx), if any.
    pub fn last(&self) -> Option<Value> {
        self.documents.lock().ok()?.last().cloned()
    }
}

async fn answer(
    req: Request<Incoming>,
    current: SocketAddr,
    kept: &Mutex<Vec<Value>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, 16 * 1024 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return respond(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
    };
    let pushed = (parts.method == Method::PUT && parts.uri.path() == "/config")
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten();
    match forward(parts, body, current).await {
        Ok(response) => {
            if let (Some(doc), true) = (pushed, response.status().is_success()) {
                if let Ok(mut kept) = kept.lock() {
                    kept.push(doc);
                }
            }
            response
        }
        Err(e) => respond(StatusCode::BAD_GATEWAY, e),
    }
}
