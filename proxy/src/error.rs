//! The one place where request failures become responses.

use crate::access::AccessError;
use crate::forward::payload::UnreadableBody;
use crate::forward::request::UnforwardableTarget;
use crate::forward::retry::ExchangeError;
use crate::forward::ForwardError;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use std::borrow::Cow;
use std::fmt::Write as _;

/// Why the proxy answered a request itself instead of relaying a backend's answer.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches")]
    NoRoute,
    /// No config has been loaded since start, so no route can match yet.
    #[error("no config loaded")]
    NoConfig,
    #[error("route is unavailable")]
    Unavailable(StatusCode),
    #[error("no backend can take the request")]
    NoBackend,
    #[error(transparent)]
    Backend(#[from] ForwardError),
    #[error("request timed out")]
    RequestTimeout,
    /// The client sent no request body for the proxy's body timeout before any response.
    #[error("request body timed out")]
    BodyTimeout,
    #[error("request could not be forwarded: {0}")]
    BadRequest(&'static str),
    /// The request's body is framed by a transfer coding other than `chunked` alone
    /// (`gzip, chunked`): the proxy would pass its coded bytes on as the body itself, so it
    /// answers 501, as Go's server does (RFC 9112 §6.1).
    #[error("request transfer coding is not implemented")]
    UnsupportedTransferCoding,
    /// The rule requires a Cloudflare Access token and the request has no valid one.
    #[error("access denied: {0}")]
    AccessDenied(AccessError),
    /// The backend answered `101 Switching Protocols` with nothing to splice: it switched a
    /// WebSocket handshake to another protocol, which is never spliced, or switched a request
    /// that asked for no upgrade (RFC 9110 §15.2.2). Its connection has left HTTP.
    #[error("backend switched to a protocol the request did not ask for")]
    BadUpgrade,
}

impl ProxyError {
    /// A stable name for the failure (`error.type` on spans, `error` in the access log): the
    /// backend error's label for a backend failure (`dial`, `timeout`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoRoute => "no_route",
            Self::NoConfig => "no_config",
            Self::Unavailable(_) => "unavailable",
            Self::NoBackend => "no_backend",
            Self::Backend(e) => e.label(),
            Self::RequestTimeout => "request_timeout",
            Self::BodyTimeout => "body_timeout",
            Self::BadRequest(_) => "bad_request",
            Self::UnsupportedTransferCoding => "unsupported_transfer_coding",
            Self::AccessDenied(_) => "access_denied",
            Self::BadUpgrade => "bad_upgrade",
        }
    }

    /// The `reason` a failure counts under in `cftunnel_proxy_backend_errors_total`; `None`
    /// for one that is not the backend's.
    pub fn backend_reason(&self) -> Option<&'static str> {
        match self {
            Self::Backend(e) => Some(e.label()),
            // A backend that broke the protocol: none of the contract's other reasons fits.
            Self::BadUpgrade => Some("other"),
            _ => None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoRoute => StatusCode::NOT_FOUND,
            Self::NoConfig => StatusCode::BAD_GATEWAY,
            Self::Unavailable(s) => *s,
            Self::NoBackend => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Backend(ForwardError::Timeout) | Self::RequestTimeout => {
                StatusCode::GATEWAY_TIMEOUT
            }
            // Connected, then reset or closed before a response head: the backend is there but
            // cannot serve now (as Envoy-based implementations answer).
            Self::Backend(ForwardError::Other(_) | ForwardError::Canceled) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // Every connection to the backend stayed busy: it is there but cannot take more
            // now (as Envoy answers a full connection pool).
            Self::Backend(ForwardError::Saturated) => StatusCode::SERVICE_UNAVAILABLE,
            // An answer that is not HTTP is the backend's failure, not a lack of capacity
            // (RFC 9110 §15.6.3).
            Self::Backend(ForwardError::InvalidResponse(_)) => StatusCode::BAD_GATEWAY,
            Self::Backend(_) => StatusCode::BAD_GATEWAY,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedTransferCoding => StatusCode::NOT_IMPLEMENTED,
            Self::AccessDenied(_) => StatusCode::FORBIDDEN,
            Self::BadUpgrade => StatusCode::BAD_GATEWAY,
        }
    }

    /// gRPC status for gRPC clients, which read trailers rather than the HTTP status.
    fn grpc_status(&self) -> &'static str {
        match self {
            // A rule answering 404 stands for "no route" (a listener's hostnames kept to its
            // own routes): gRPC's UNIMPLEMENTED, as for no match at all.
            Self::NoRoute => "12",
            Self::Unavailable(s) if *s == StatusCode::NOT_FOUND => "12",
            Self::Backend(ForwardError::Timeout) | Self::RequestTimeout | Self::BodyTimeout => "4",
            // INTERNAL, as gRPC's own clients report a malformed response: UNAVAILABLE would
            // tell the client a retry is safe, and the backend may have acted on the call.
            Self::Backend(ForwardError::InvalidResponse(_)) => "13",
            Self::Backend(_) => "14",
            Self::Unavailable(_) | Self::NoBackend | Self::NoConfig | Self::BadUpgrade => "14",
            Self::BadRequest(_) => "3",
            Self::UnsupportedTransferCoding => "12",
            Self::AccessDenied(_) => "7",
        }
    }

    /// Status and headers of the answer; the body is the reason in plain text (empty for gRPC,
    /// whose answer is of the content type family its call was).
    pub fn head(&self, grpc: Option<GrpcAnswer>) -> (StatusCode, HeaderMap, &'static str) {
        let mut headers = HeaderMap::new();
        if let Some(grpc) = grpc {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(grpc.content_type),
            );
            headers.insert("grpc-status", HeaderValue::from_static(self.grpc_status()));
            if let Ok(v) = HeaderValue::from_str(&grpc_message(self.reason().trim_end())) {
                headers.insert("grpc-message", v);
            }
            return (StatusCode::OK, headers, "");
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        (self.status(), headers, self.reason())
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::NoRoute => "no route matches this request\n",
            Self::NoConfig => "the proxy has not been given its routes yet\n",
            Self::Unavailable(s) if *s == StatusCode::NOT_FOUND => {
                "no route matches this request\n"
            }
            Self::Unavailable(_) => "route backend is unavailable\n",
            Self::NoBackend => "no backend is available for this route\n",
            Self::Backend(ForwardError::Timeout) | Self::RequestTimeout => "upstream timed out\n",
            Self::BodyTimeout => "the request body stopped arriving\n",
            Self::Backend(ForwardError::Tls(_)) => "upstream TLS handshake failed\n",
            Self::Backend(ForwardError::Dial(_)) => "upstream connection failed\n",
            Self::Backend(ForwardError::Other(_) | ForwardError::Canceled) => {
                "upstream reset or closed the connection\n"
            }
            Self::Backend(ForwardError::Saturated) => "upstream connection limit reached\n",
            Self::Backend(ForwardError::InvalidResponse(_)) => {
                "upstream sent an invalid response\n"
            }
            Self::BadRequest(r) => r,
            Self::UnsupportedTransferCoding => {
                "the request's transfer coding is not implemented: only chunked is\n"
            }
            // Why exactly is for the operator's log, not for the client.
            Self::AccessDenied(_) => "a valid Cloudflare Access token is required\n",
            Self::BadUpgrade => "upstream switched to a protocol the request did not ask for\n",
        }
    }
}

/// What the proxy's own answer to a gRPC call says it is: a gRPC-Web client (grpc-web,
/// connect-web) refuses an answer whose `content-type` is not of its call's family before it
/// reads `grpc-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcAnswer {
    content_type: &'static str,
}

impl GrpcAnswer {
    /// The answer to a request whose `content-type` is gRPC's (`application/grpc...`), in the
    /// request's family: `application/grpc`, `application/grpc-web` or
    /// `application/grpc-web-text`, with the `+proto` or `+json` the request named;
    /// `None` for a request that is not a gRPC call.
    pub fn of(request: &HeaderMap) -> Option<Self> {
        let value = request.get(header::CONTENT_TYPE)?.as_bytes();
        let rest = value.strip_prefix(b"application/grpc")?;
        let (text, rest) = if let Some(rest) = strip_prefix_ignore_case(rest, b"-web-text") {
            (true, rest)
        } else if let Some(rest) = strip_prefix_ignore_case(rest, b"-web") {
            (false, rest)
        } else {
            return Some(Self {
                content_type: "application/grpc",
            });
        };
        // The message format, before any parameter (`; charset=...`).
        let format = rest
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let proto = format.eq_ignore_ascii_case(b"+proto");
        let json = format.eq_ignore_ascii_case(b"+json");
        let content_type = match (text, proto, json) {
            (false, true, _) => "application/grpc-web+proto",
            (false, _, true) => "application/grpc-web+json",
            (false, _, _) => "application/grpc-web",
            (true, true, _) => "application/grpc-web-text+proto",
            (true, _, true) => "application/grpc-web-text+json",
            (true, _, _) => "application/grpc-web-text",
        };
        Some(Self { content_type })
    }

    /// Whether the call is gRPC-Web's, whose status travels in a frame of the body: HTTP
    /// trailers never reach its clients (browsers).
    pub fn is_web(&self) -> bool {
        self.content_type != "application/grpc"
    }
}

fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (head, rest) = value.split_at_checked(prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then_some(rest)
}

/// `message` as `grpc-message` carries it: percent-encoded, every byte outside printable
/// ASCII and every `%` written `%XX` (gRPC over HTTP/2, "Responses").
fn grpc_message(message: &str) -> Cow<'_, str> {
    let plain = |b: u8| (0x20..=0x7e).contains(&b) && b != b'%';
    if message.bytes().all(plain) {
        return Cow::Borrowed(message);
    }
    let mut encoded = String::with_capacity(message.len() + 16);
    for b in message.bytes() {
        if plain(b) {
            encoded.push(char::from(b));
        } else {
            // Writing to a `String` cannot fail.
            let _ = write!(encoded, "%{b:02X}");
        }
    }
    Cow::Owned(encoded)
}

impl From<UnreadableBody> for ProxyError {
    fn from(_: UnreadableBody) -> Self {
        Self::BadRequest("request body could not be read\n")
    }
}

impl From<UnforwardableTarget> for ProxyError {
    fn from(_: UnforwardableTarget) -> Self {
        Self::BadRequest("request target cannot be forwarded\n")
    }
}

impl From<ExchangeError> for ProxyError {
    fn from(e: ExchangeError) -> Self {
        match e {
            ExchangeError::Backend(e) => Self::Backend(e),
            ExchangeError::Target(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_closed_before_the_request_answers_as_a_reset_one() {
        let closed = ProxyError::Backend(ForwardError::Canceled).head(None);
        let reset = ProxyError::Backend(ForwardError::Other("reset".into())).head(None);
        assert_eq!(
            (closed.0, closed.2),
            (StatusCode::SERVICE_UNAVAILABLE, reset.2)
        );
        assert_eq!(reset.2, "upstream reset or closed the connection\n");
    }

    #[test]
    fn grpc_clients_read_a_404_rule_as_unimplemented() {
        let status = |e: ProxyError| {
            let grpc = GrpcAnswer::of(&HeaderMap::from_iter([(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            )]));
            let (code, headers, _) = e.head(grpc);
            assert_eq!(code, StatusCode::OK);
            headers.get("grpc-status").cloned()
        };
        assert_eq!(
            status(ProxyError::NoRoute)
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"12"[..])
        );
        assert_eq!(
            status(ProxyError::Unavailable(StatusCode::NOT_FOUND))
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"12"[..])
        );
        assert_eq!(
            status(ProxyError::Unavailable(StatusCode::SERVICE_UNAVAILABLE))
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"14"[..])
        );
        let (code, _, body) = ProxyError::Unavailable(StatusCode::NOT_FOUND).head(None);
        assert_eq!(
            (code, body),
            (StatusCode::NOT_FOUND, "no route matches this request\n")
        );
    }

    #[test]
    fn grpc_answers_keep_the_family_and_format_of_the_call() {
        let answer = |content_type: &'static str| {
            let request = HeaderMap::from_iter([(
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            )]);
            GrpcAnswer::of(&request).map(|a| a.content_type)
        };
        for (request, expected) in [
            ("application/grpc", Some("application/grpc")),
            ("application/grpc+proto", Some("application/grpc")),
            ("application/grpc-web", Some("application/grpc-web")),
            (
                "application/grpc-web+proto",
                Some("application/grpc-web+proto"),
            ),
            (
                "application/grpc-web+JSON",
                Some("application/grpc-web+json"),
            ),
            ("application/grpc-web+thrift", Some("application/grpc-web")),
            (
                "application/grpc-web-text",
                Some("application/grpc-web-text"),
            ),
            (
                "application/grpc-web-text+proto; charset=utf-8",
                Some("application/grpc-web-text+proto"),
            ),
            ("text/plain", None),
        ] {
            assert_eq!(answer(request), expected, "{request}");
        }
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("plain text: ok"), "plain text: ok");
        assert_eq!(grpc_message("100% sure"), "100%25 sure");
        assert_eq!(grpc_message("caf\u{e9}\tbar"), "caf%C3%A9%09bar");
    }
}
