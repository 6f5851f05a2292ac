//! The answers every handler builds: JSON bodies, and errors as `Status` objects with the API
//! server's reasons and codes.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

/// An answer: a JSON document, or a watch's stream of them.
pub(super) type Reply = Response<BoxBody<Bytes, Infallible>>;

/// `body` as JSON, with `code`.
pub(super) fn respond(code: StatusCode, body: &Value) -> Reply {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *res.status_mut() = code;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

/// A failure `Status` with `code`, its `reason` and `message`.
pub(super) fn status(code: StatusCode, reason: &str, message: &str) -> Reply {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// The 404 the API server answers a path it serves nothing at.
pub(super) fn not_served() -> Reply {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// The 400 the API server answers a body that is not JSON.
pub(super) fn not_json() -> Reply {
    status(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        "the body is not JSON",
    )
}

/// The 405 for a method a path does not take.
pub(super) fn method_not_allowed() -> Reply {
    status(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "method not allowed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_is_a_status_object_with_its_code_and_reason() {
        let reply = status(StatusCode::CONFLICT, "AlreadyExists", "a exists");
        assert_eq!(reply.status(), StatusCode::CONFLICT);
        assert_eq!(
            reply
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/json")
        );
        let body = reply
            .into_body()
            .collect()
            .await
            .expect("a full body")
            .to_bytes();
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            body,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "a exists", "reason": "AlreadyExists", "code": 409})
        );
    }
}
