//! One call to the gRPC echo: what grpc-go's transport checks before a handler runs (POST,
//! a gRPC `content-type`), the method lookup, and the `Echo`/`EchoTwo` answer built from the
//! request as received. The handlers run in tonic's server half, which decodes the request
//! message and writes the response and its status trailers.

use std::future::{ready, Ready};

use http::{HeaderMap, Method, StatusCode};
use tonic::body::Body;
use tonic::server::{Grpc, UnaryService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use super::proto::{Assertions, Context, EchoRequest, EchoResponse, Header, SERVICE};
use crate::echo::EchoIdentity;

/// Metadata grpc-go's server keeps to itself (`isReservedHeader` less the headers it passes
/// on anyway: `content-type` and `user-agent`); `host` is handled apart.
const TRANSPORT_HEADERS: &[&str] = &[
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-status",
    "grpc-message",
    "grpc-message-type",
    "grpc-status-details-bin",
];

/// What a `:path` leads to.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    /// `Echo` or `EchoTwo`, by name.
    Echo(&'a str),
    /// `EchoThree`, which the service declares and does not implement.
    EchoThree,
    UnknownMethod(&'a str),
    UnknownService(&'a str),
    Malformed,
}

fn route(path: &str) -> Route<'_> {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.rsplit_once('/')) else {
        return Route::Malformed;
    };
    if service != SERVICE {
        return Route::UnknownService(service);
    }
    match method {
        "Echo" | "EchoTwo" => Route::Echo(method),
        "EchoThree" => Route::EchoThree,
        other => Route::UnknownMethod(other),
    }
}

/// grpc-go's test of a gRPC `content-type`: `application/grpc`, optionally followed by
/// `+<subtype>` or `;<parameters>`.
pub(super) fn is_grpc_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(rest) = value
        .get(.."application/grpc".len())
        .filter(|p| p.eq_ignore_ascii_case("application/grpc"))
        .map(|_| &value["application/grpc".len()..])
    else {
        return false;
    };
    rest.is_empty() || rest.starts_with('+') || rest.starts_with(';')
}

/// Answers one request.
pub(super) async fn handle<B>(
    req: http::Request<B>,
    identity: &EchoIdentity,
) -> http::Response<Body>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    // grpc-go refuses these before any handler runs, with an HTTP status and a gRPC status.
    if req.method() != Method::POST {
        let status = Status::internal(format!(
            "http2Server.operateHeaders parsed a :method field: {} which should be POST",
            req.method()
        ));
        return early_abort(StatusCode::METHOD_NOT_ALLOWED, status);
    }
    if !is_grpc_content_type(req.headers()) {
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let status = Status::invalid_argument(format!(
            "invalid gRPC request content-type {content_type:?}"
        ));
        return early_abort(StatusCode::UNSUPPORTED_MEDIA_TYPE, status);
    }
    let path = req.uri().path().to_owned();
    let reply = match route(&path) {
        Route::Echo(method) => Ok(echo(&req, method, identity)),
        Route::EchoThree => Err(Status::unimplemented("method EchoThree not implemented")),
        // grpc-go answers these without reading the request.
        Route::UnknownMethod(method) => {
            return Status::unimplemented(format!("unknown method {method} for service {SERVICE}"))
                .into_http()
        }
        Route::UnknownService(service) => {
            return Status::unimplemented(format!("unknown service {service}")).into_http()
        }
        Route::Malformed => {
            return Status::unimplemented(format!("malformed method name: {path:?}")).into_http()
        }
    };
    Grpc::new(ProstCodec::<EchoResponse, EchoRequest>::default())
        .unary(Reply(reply), req)
        .await
}

/// A status answered with an HTTP status other than 200, as grpc-go's `earlyAbortStream`.
fn early_abort(http_status: StatusCode, status: Status) -> http::Response<Body> {
    let mut response = status.into_http();
    *response.status_mut() = http_status;
    response
}

/// The answer of `Echo` and `EchoTwo`: the method that ran, the request's metadata and
/// `:authority` as received, and the pod's identity.
fn echo<B>(req: &http::Request<B>, method: &str, identity: &EchoIdentity) -> EchoResponse {
    let (authority, headers) = metadata(req);
    EchoResponse {
        assertions: Some(Assertions {
            fully_qualified_method: format!("/{SERVICE}/{method}"),
            headers,
            authority,
            context: Some(Context {
                namespace: identity.namespace.clone(),
                ingress: String::new(),
                service_name: String::new(),
                pod: identity.pod.clone(),
            }),
            tls_assertions: None,
        }),
        request: None,
    }
}

/// The `:authority` and the metadata entries grpc-go's server hands its handlers: every
/// header line but the pseudo-headers and the transport's own, plus `:authority`, which a
/// `host` header stands in for when the request has none (a `host` is dropped otherwise).
fn metadata<B>(req: &http::Request<B>) -> (String, Vec<Header>) {
    let host = req
        .headers()
        .get(http::header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or(host)
        .unwrap_or_default();
    let mut headers = Vec::new();
    if !authority.is_empty() {
        headers.push(Header {
            key: ":authority".to_owned(),
            value: authority.clone(),
        });
    }
    for (name, value) in req.headers() {
        if name == http::header::HOST || TRANSPORT_HEADERS.contains(&name.as_str()) {
            continue;
        }
        headers.push(Header {
            key: name.as_str().to_owned(),
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
        });
    }
    (authority, headers)
}

/// A handler's outcome, decided before the request message is read (the echo's answers do
/// not depend on it: `EchoRequest` has no fields).
struct Reply(Result<EchoResponse, Status>);

impl UnaryService<EchoRequest> for Reply {
    type Response = EchoResponse;
    type Future = Ready<Result<tonic::Response<EchoResponse>, Status>>;

    fn call(&mut self, _request: tonic::Request<EchoRequest>) -> Self::Future {
        let outcome = std::mem::replace(&mut self.0, Err(Status::new(Code::Internal, "answered")));
        ready(outcome.map(tonic::Response::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_lead_to_the_methods_of_the_service() {
        assert_eq!(route(super::super::proto::ECHO), Route::Echo("Echo"));
        assert_eq!(route(super::super::proto::ECHO_TWO), Route::Echo("EchoTwo"));
        assert_eq!(route(super::super::proto::ECHO_THREE), Route::EchoThree);
        assert_eq!(
            route("/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/EchoFour"),
            Route::UnknownMethod("EchoFour")
        );
        assert_eq!(
            route("/grpc.health.v1.Health/Check"),
            Route::UnknownService("grpc.health.v1.Health")
        );
        assert_eq!(route("Echo"), Route::Malformed);
    }

    #[test]
    fn grpc_content_types_are_recognised_as_grpc_go_does() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                v.parse().expect("a header value"),
            );
            is_grpc_content_type(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("application/grpc;charset=utf-8"));
        assert!(with("Application/GRPC"));
        assert!(!with("application/grpcx"));
        assert!(!with("application/json"));
        assert!(!is_grpc_content_type(&HeaderMap::new()));
    }

    #[test]
    fn metadata_keeps_every_line_and_drops_the_transport_headers() {
        let req = http::Request::post("http://gw.example:80/s/M")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "30000000u")
            .header("user-agent", "grpc-go/1.83.0")
            .header("x-add", "one")
            .header("x-add", "two")
            .header("x-joined", "a,b")
            .header("host", "ignored.example")
            .body(())
            .expect("a request");
        let (authority, headers) = metadata(&req);
        assert_eq!(authority, "gw.example:80");
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (":authority", "gw.example:80"),
                ("content-type", "application/grpc"),
                ("user-agent", "grpc-go/1.83.0"),
                ("x-add", "one"),
                ("x-add", "two"),
                ("x-joined", "a,b"),
            ]
        );
    }

    #[test]
    fn a_host_header_stands_in_for_a_missing_authority() {
        let req = http::Request::post("/s/M")
            .header("host", "from-host.example")
            .body(())
            .expect("a request");
        let (authority, headers) = metadata(&req);
        assert_eq!(authority, "from-host.example");
        assert_eq!(
            headers,
            [Header {
                key: ":authority".to_owned(),
                value: "from-host.example".to_owned()
            }]
        );
    }
}
