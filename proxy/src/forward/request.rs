//! The request a try sends: the client's request, once routed and filtered, rebuilt for one
//! backend (its base path before the request's, its host where the request has none).

use super::Upstream;
use crate::body::ProxyBody;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Uri};

/// The request's target cannot be put behind the backend's base path.
#[derive(Debug, thiserror::Error)]
#[error("request target cannot be forwarded")]
pub struct UnforwardableTarget;

/// What it takes to write a request again: its head and its whole body.
pub(super) struct Replay {
    head: Request<()>,
    body: Bytes,
}

impl Replay {
    pub(super) fn of(req: &Request<ProxyBody>, body: &Bytes) -> Self {
        let mut head = Request::new(());
        *head.method_mut() = req.method().clone();
        *head.uri_mut() = req.uri().clone();
        *head.version_mut() = req.version();
        *head.headers_mut() = req.headers().clone();
        Self {
            head,
            body: body.clone(),
        }
    }

    pub(super) fn into_request(self) -> Request<ProxyBody> {
        self.head.map(|()| crate::body::full(self.body))
    }
}

/// The query of a request to a backend whose URL has the query `base`: the request's own
/// parameters, then those of `base` whose name the request does not use (the request's win).
/// Names are compared as written (percent-encoded).
fn merge_query(own: Option<&str>, base: &str) -> String {
    let own = own.filter(|q| !q.is_empty());
    let mut out = String::with_capacity(own.map_or(0, str::len) + base.len() + 1);
    if let Some(own) = own {
        out.push_str(own);
    }
    for pair in base.split('&').filter(|p| !p.is_empty()) {
        let key = param_name(pair);
        let taken = own.is_some_and(|own| own.split('&').any(|p| param_name(p) == key));
        if !taken {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(pair);
        }
    }
    out
}

/// The name of a `name=value` query parameter.
fn param_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name)
}

/// Builds the request for one try (or one mirror copy) against `upstream`.
pub(crate) fn upstream_request(
    parts: &http::request::Parts,
    headers: HeaderMap,
    upstream: &Upstream,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, UnforwardableTarget> {
    let pq = parts.uri.path_and_query();
    let path_and_query = match (upstream.base_path(), upstream.base_query(), pq) {
        (None, None, Some(pq)) => pq.clone(),
        (None, None, None) => http::uri::PathAndQuery::from_static("/"),
        (base, None, pq) => {
            let pq = pq.map_or("/", |pq| pq.as_str());
            http::uri::PathAndQuery::try_from(format!("{}{pq}", base.unwrap_or("")))
                .map_err(|_| UnforwardableTarget)?
        }
        (base, Some(base_query), pq) => {
            let path = pq.map_or("/", |pq| pq.path());
            let query = merge_query(pq.and_then(|pq| pq.query()), base_query);
            http::uri::PathAndQuery::try_from(format!("{}{path}?{query}", base.unwrap_or("")))
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

#[cfg(test)]
mod tests {
    use super::merge_query;

    #[test]
    fn the_backends_query_fills_in_parameters_the_request_does_not_set() {
        assert_eq!(merge_query(None, "token=abc"), "token=abc");
        assert_eq!(merge_query(Some(""), "token=abc"), "token=abc");
        assert_eq!(merge_query(Some("q=1"), "token=abc"), "q=1&token=abc");
        assert_eq!(
            merge_query(Some("token=mine&q=1"), "token=abc&v=2"),
            "token=mine&q=1&v=2"
        );
        // A name without a value counts as set.
        assert_eq!(merge_query(Some("token"), "token=abc"), "token");
        assert_eq!(merge_query(Some("tok=1"), "token=abc"), "tok=1&token=abc");
    }
}
