//! The echo server's plain answers, shared by its routes.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::Full;

/// Every answer the echo server gives: its body is whole before it is sent.
pub(crate) type EchoResponse = Response<Full<Bytes>>;

/// An answer with `status` and no body.
pub(crate) fn bare(status: StatusCode) -> EchoResponse {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// An answer with `status` and a plain-text `body`.
pub(crate) fn text(status: StatusCode, body: &'static str) -> EchoResponse {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
