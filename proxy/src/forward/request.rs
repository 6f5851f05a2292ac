//! The request a try sends: the client's request, once routed and filtered, rebuilt for one
//! backend (its base path before the request's, its host where the request has none).

use super::Upstream;
use crate::body::ProxyBody;
use http::{header, HeaderMap, HeaderValue, Request, Uri};

/// The request's target cannot be put behind the backend's base path.
#[derive(Debug, thiserror::Error)]
#[error("request target cannot be forwarded")]
pub struct UnforwardableTarget;

/// Builds the request for one try (or one mirror copy) against `upstream`.
pub(crate) fn upstream_request(
    parts: &http::request::Parts,
    headers: HeaderMap,
    upstream: &Upstream,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, UnforwardableTarget> {
    let path_and_query = match (upstream.base_path(), parts.uri.path_and_query()) {
        (None, Some(pq)) => pq.clone(),
        (None, None) => http::uri::PathAndQuery::from_static("/"),
        (Some(base), pq) => {
            let pq = pq.map_or("/", |pq| pq.as_str());
            http::uri::PathAndQuery::try_from(format!("{base}{pq}"))
                .map_err(|_| UnforwardableTarget)?
        }
    };
    // An origin-form target; the client's host travels in the `Host` header, which the
    // handler has made consistent with what was routed on. Over HTTP/2 it becomes `:authority`.
    // Connections are chosen without the URI, so a varying host never opens new ones.
    let uri = Uri::from(path_and_query);
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    if !req.headers().contains_key(header::HOST) {
        if let Ok(v) = HeaderValue::from_str(upstream.authority().as_str()) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    Ok(req)
}
