//! The mock's plain-HTTP listener, where eyeballs arrive: the admin API under
//! `/__mock-edge/`, the edge's request limits, and everything else forwarded through the
//! tunnel.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderValue, SERVER};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::answer::EdgeBody;
use super::forward::{forward, full};
use super::listen::accept_next;
use super::{admin, Inner};

/// Serves eyeballs on `listener` (HTTP/1.1 and HTTP/2) until the mock shuts down.
pub(super) fn spawn_http(inner: &Arc<Inner>, listener: tokio::net::TcpListener) {
    let inner2 = inner.clone();
    inner.tasks.spawn(async move {
        loop {
            let accepted = accept_next("eyeball http", &inner2.cancel, || listener.accept()).await;
            let Some((tcp, peer)) = accepted else { return };
            let _ = tcp.set_nodelay(true);
            let inner3 = inner2.clone();
            let cancel = inner2.cancel.clone();
            inner2.tasks.spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let inner = inner3.clone();
                    async move { Ok::<_, Infallible>(handle(inner, req, peer.ip()).await) }
                });
                let mut builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                // The edge limits a head by size, not by line count (`head_too_large`).
                builder.http1().max_headers(MAX_HEADER_LINES);
                builder
                    .http2()
                    .max_header_list_size(2 * MAX_HEADERS_TOTAL as u32);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
                tokio::select! {
                    res = conn => {
                        if let Err(e) = res {
                            tracing::debug!(error = %e, "mock edge eyeball connection ended");
                        }
                    }
                    _ = cancel.cancelled() => {}
                }
            });
        }
    });
}

async fn handle(inner: Arc<Inner>, req: Request<Incoming>, peer: IpAddr) -> Response<EdgeBody> {
    if req.uri().path().starts_with(admin::PREFIX) {
        return admin::handle(&inner, req).await;
    }
    if let Some(mut refused) = head_too_large(&req) {
        refused
            .headers_mut()
            .insert(SERVER, HeaderValue::from_static("cloudflare"));
        return refused;
    }
    forward(&inner, req, peer).await
}

/// Cloudflare's documented request limits: a URL of at most 16 KB, request headers of at
/// most 32 KB in all and 16 KB each. No line count is documented; the listener's is set high
/// enough that only the sizes bind.
const MAX_URL: usize = 16 * 1024;
const MAX_HEADERS_TOTAL: usize = 32 * 1024;
const MAX_HEADER: usize = 16 * 1024;
const MAX_HEADER_LINES: usize = 2048;

/// The answer to a request over the edge's limits, if it is: 414 for the URL, 400 for the
/// headers (each header counted as `name: value` and its line end).
fn head_too_large<B>(req: &Request<B>) -> Option<Response<EdgeBody>> {
    let url = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if url > MAX_URL {
        return Some(full(
            StatusCode::URI_TOO_LONG,
            "414 Request-URI Too Large\n",
        ));
    }
    let mut total = 0;
    for (name, value) in req.headers() {
        let size = name.as_str().len() + value.len() + 4;
        total += size;
        if size > MAX_HEADER || total > MAX_HEADERS_TOTAL {
            return Some(full(
                StatusCode::BAD_REQUEST,
                "400 Request Header Or Cookie Too Large\n",
            ));
        }
    }
    None
}
