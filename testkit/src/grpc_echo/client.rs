//! A unary gRPC client over cleartext HTTP/2 with prior knowledge that behaves as grpc-go's
//! (the conformance suite's client, `v1.83.0`) where the suite's verdicts depend on it: what
//! it sends (`te`, `user-agent`, `grpc-timeout`, lower-case metadata keys, one DATA frame
//! with the length-prefixed message) and how a response becomes a status code
//! ([`outcome`]): a non-200 `:status` decides whatever `grpc-status` says, a 200 without a
//! gRPC `content-type` is UNKNOWN, otherwise the `grpc-status` of the trailers (or of the
//! only HEADERS frame). A call that fails on the wire ends with a code too
//! ([`Connection::unary`]), as in grpc-go: it is an outcome, never an error.

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use percent_encoding::percent_decode;
use prost::Message as _;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tonic::Code;

use super::handler::is_grpc_content_type;
use super::proto::{EchoRequest, EchoResponse};

/// The `user-agent` grpc-go sends (its version in the conformance suite's `go.mod`).
pub const USER_AGENT: &str = "grpc-go/1.83.0";
/// Responses larger than this fail the call (grpc-go's default receive limit is 4 MiB).
const MAX_RESPONSE: usize = 4 << 20;

/// One unary call.
#[derive(Debug, Clone)]
pub struct Call {
    /// `:authority`. grpc-go's default is the dial target, `host:port`.
    pub authority: String,
    /// `:path`: `/<service>/<method>`.
    pub path: String,
    /// Request metadata, one header line each; keys are sent lower-cased, as grpc-go's
    /// `metadata.New` makes them.
    pub metadata: Vec<(String, String)>,
    /// The call's deadline from now, sent as `grpc-timeout`; the call ends with
    /// DEADLINE_EXCEEDED when it passes.
    pub timeout: Duration,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub code: Code,
    /// `grpc-message`, percent-decoded, or the client's own reason.
    pub message: String,
    /// The response message, on OK only.
    pub response: Option<EchoResponse>,
}

impl Outcome {
    fn failed(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            response: None,
        }
    }
}

/// One HTTP/2 connection, driven by a task of its own; calls on it share it.
pub struct Connection {
    sender: http2::SendRequest<RequestBody>,
    driver: JoinHandle<()>,
}

impl Connection {
    /// Connects to `addr` and starts HTTP/2 with prior knowledge.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(io::Error::other)?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender, driver })
    }

    /// Whether the connection can take no more calls (grpc-go would redial).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Makes the call; its outcome, whatever happened on the wire.
    pub async fn unary(&mut self, call: &Call) -> Outcome {
        match tokio::time::timeout(call.timeout, self.exchange(call)).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::failed(Code::DeadlineExceeded, "context deadline exceeded"),
        }
    }

    async fn exchange(&mut self, call: &Call) -> Outcome {
        let request = match request(call) {
            Ok(request) => request,
            Err(e) => return Outcome::failed(Code::Internal, format!("building the call: {e}")),
        };
        if let Err(e) = self.sender.ready().await {
            return from_transport(&e);
        }
        let response = match self.sender.send_request(request).await {
            Ok(response) => response,
            Err(e) => return from_transport(&e),
        };
        let (head, body) = response.into_parts();
        let collected = match Limited::new(body, MAX_RESPONSE).collect().await {
            Ok(collected) => collected,
            Err(e) => return from_transport(e.as_ref()),
        };
        let trailers = collected.trailers().cloned();
        outcome(
            head.status,
            &head.headers,
            &collected.to_bytes(),
            trailers.as_ref(),
        )
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Calls to one address over one connection, dialled when a call needs it, as a grpc-go
/// `ClientConn` does: a call after the connection closed dials again, and a dial counts
/// against the call's deadline (a failed one is the call's UNAVAILABLE).
pub struct Client {
    addr: SocketAddr,
    conn: Option<Connection>,
}

impl Client {
    /// A client of `addr`; nothing is dialled yet.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, conn: None }
    }

    /// Makes the call, dialling first if there is no open connection.
    pub async fn unary(&mut self, call: &Call) -> Outcome {
        let addr = self.addr;
        let slot = &mut self.conn;
        let once = async move {
            let conn = match slot.take().filter(|c| !c.is_closed()) {
                Some(conn) => slot.insert(conn),
                None => match Connection::connect(addr).await {
                    Ok(conn) => slot.insert(conn),
                    Err(e) => {
                        return Outcome::failed(Code::Unavailable, format!("connection error: {e}"))
                    }
                },
            };
            conn.exchange(call).await
        };
        match tokio::time::timeout(call.timeout, once).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::failed(Code::DeadlineExceeded, "context deadline exceeded"),
        }
    }

    /// Closes the connection, if any: the next call dials a new one.
    pub fn disconnect(&mut self) {
        self.conn = None;
    }
}

/// Makes one call on a connection of its own, closed afterwards.
pub async fn call_once(addr: SocketAddr, call: &Call) -> Outcome {
    Client::new(addr).unary(call).await
}

/// A request body of one DATA frame whose size is not announced: a body of known size would
/// make hyper add a `content-length`, which grpc-go does not send.
type RequestBody = StreamBody<tokio_stream::Once<Result<Frame<Bytes>, std::convert::Infallible>>>;

/// The HTTP/2 request of a call: `POST`, `:scheme http`, then the headers grpc-go writes and
/// the metadata, and one DATA frame with the empty `EchoRequest`.
fn request(call: &Call) -> Result<http::Request<RequestBody>, http::Error> {
    let mut builder = http::Request::post(format!("http://{}{}", call.authority, call.path))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, USER_AGENT)
        .header("grpc-timeout", encode_timeout(call.timeout));
    for (key, value) in &call.metadata {
        builder = builder.header(key.to_ascii_lowercase(), value.as_str());
    }
    let message = Frame::data(frame(&EchoRequest {}));
    builder.body(StreamBody::new(tokio_stream::once(Ok(message))))
}

/// A message as one gRPC frame: not compressed, 4-byte big-endian length, the message.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode_raw(&mut out);
    out.freeze()
}

/// grpc-go's `encodeTimeout`: the smallest unit, from nanoseconds up, whose count (rounded
/// up) fits in 8 digits.
pub fn encode_timeout(timeout: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = timeout.as_nanos();
    if nanos == 0 {
        return "0n".to_owned();
    }
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per, unit) in units {
        let count = nanos.div_ceil(per);
        if count <= MAX {
            return format!("{count}{unit}");
        }
    }
    format!("{MAX}H")
}

/// grpc-go's code for a response whose `:status` is not 200, whatever its `grpc-status`.
pub fn code_of_http_status(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// grpc-go's code for a stream reset with `reason` (its `http2ErrConvTab`).
pub fn code_of_reset(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::FLOW_CONTROL_ERROR | h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// The outcome of a call that failed on the wire: a stream reset by its reason, anything
/// else (refused, closed connection) UNAVAILABLE.
fn from_transport(error: &(dyn StdError + 'static)) -> Outcome {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(reason) = e.downcast_ref::<h2::Error>().and_then(h2::Error::reason) {
            return Outcome::failed(code_of_reset(reason), format!("stream reset: {error}"));
        }
        cause = e.source();
    }
    Outcome::failed(Code::Unavailable, format!("connection error: {error}"))
}

/// How grpc-go reads a complete response: `:status`, then `content-type`, then
/// `grpc-status` from the trailers or, for a trailers-only response (one HEADERS frame, no
/// body), from the headers; on OK the body must hold exactly one `EchoResponse`.
pub fn outcome(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    trailers: Option<&HeaderMap>,
) -> Outcome {
    if status != StatusCode::OK {
        return Outcome::failed(
            code_of_http_status(status),
            format!(
                "unexpected HTTP status code received from server: {} ({})",
                status.as_u16(),
                status.canonical_reason().unwrap_or_default()
            ),
        );
    }
    if !is_grpc_content_type(headers) {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        return Outcome::failed(
            Code::Unknown,
            format!("transport: received unexpected content-type {content_type:?}"),
        );
    }
    let status_from = match trailers {
        Some(trailers) => trailers,
        None if body.is_empty() && headers.contains_key("grpc-status") => headers,
        None => {
            return Outcome::failed(
                Code::Internal,
                "server closed the stream without sending trailers",
            )
        }
    };
    let code = match status_from.get("grpc-status") {
        None => Code::Unknown,
        Some(value) => match value.to_str().ok().and_then(|s| s.parse::<i32>().ok()) {
            Some(n) => Code::from_i32(n),
            None => {
                return Outcome::failed(
                    Code::Internal,
                    format!("transport: malformed grpc-status: {value:?}"),
                )
            }
        },
    };
    let message = status_from
        .get("grpc-message")
        // Percent-encoded (gRPC over HTTP/2, "Responses").
        .map(|v| {
            percent_decode(v.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    if code != Code::Ok {
        return Outcome {
            code,
            message,
            response: None,
        };
    }
    match single_message(body) {
        Ok(response) => Outcome {
            code,
            message,
            response: Some(response),
        },
        Err(why) => Outcome::failed(Code::Internal, why),
    }
}

/// The one response message of a unary call.
fn single_message(body: &[u8]) -> Result<EchoResponse, String> {
    let (Some(&flag), Some(len)) = (body.first(), body.get(1..5)) else {
        return Err(if body.is_empty() {
            "cardinality violation: received no response message".to_owned()
        } else {
            format!("truncated message frame ({} bytes)", body.len())
        });
    };
    if flag != 0 {
        return Err("grpc: compressed flag set with identity or empty encoding".to_owned());
    }
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let end = 5usize.saturating_add(len);
    let message = body
        .get(5..end)
        .ok_or_else(|| format!("truncated message: {len} bytes announced"))?;
    if body.len() > end {
        return Err(
            "cardinality violation: expected <EOF> for non server-streaming RPCs, but received another message"
                .to_owned(),
        );
    }
    EchoResponse::decode(message)
        .map_err(|e| format!("grpc: failed to unmarshal the received message: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc_echo::proto::{Assertions, ECHO};

    fn grpc_headers(extra: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/grpc".parse().expect("value"));
        for (k, v) in extra {
            headers.append(*k, v.parse().expect("value"));
        }
        headers
    }

    fn ok_body() -> Bytes {
        frame(&EchoResponse {
            assertions: Some(Assertions {
                fully_qualified_method: ECHO.to_owned(),
                ..Assertions::default()
            }),
            request: None,
        })
    }

    #[test]
    fn a_timeout_is_encoded_in_the_smallest_unit_that_fits_eight_digits() {
        assert_eq!(encode_timeout(Duration::ZERO), "0n");
        assert_eq!(
            encode_timeout(Duration::from_nanos(99_999_999)),
            "99999999n"
        );
        assert_eq!(encode_timeout(Duration::from_millis(100)), "100000u");
        assert_eq!(encode_timeout(Duration::from_secs(30)), "30000000u");
        assert_eq!(
            encode_timeout(Duration::from_nanos(29_999_999_001)),
            "30000000u"
        );
        assert_eq!(encode_timeout(Duration::from_secs(100_000)), "100000S");
        assert_eq!(encode_timeout(Duration::from_secs(1 << 40)), "99999999H");
    }

    #[test]
    fn a_non_200_status_decides_the_code_whatever_grpc_status_says() {
        let headers = grpc_headers(&[("grpc-status", "0")]);
        let code = |s: u16| {
            let status = StatusCode::from_u16(s).expect("a status");
            outcome(status, &headers, b"", None).code
        };
        assert_eq!(code(400), Code::Internal);
        assert_eq!(code(401), Code::Unauthenticated);
        assert_eq!(code(403), Code::PermissionDenied);
        assert_eq!(code(404), Code::Unimplemented);
        for s in [429, 502, 503, 504] {
            assert_eq!(code(s), Code::Unavailable, "{s}");
        }
        assert_eq!(code(500), Code::Unknown);
        assert_eq!(code(415), Code::Unknown);
    }

    #[test]
    fn a_200_without_a_grpc_content_type_is_unknown() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "text/plain".parse().expect("value"));
        headers.insert("grpc-status", "0".parse().expect("value"));
        let trailers = grpc_headers(&[("grpc-status", "0")]);
        let got = outcome(StatusCode::OK, &headers, &ok_body(), Some(&trailers));
        assert_eq!(got.code, Code::Unknown);
    }

    #[test]
    fn the_status_comes_from_the_trailers_or_a_trailers_only_response() {
        let headers = grpc_headers(&[]);
        let trailers = grpc_headers(&[("grpc-status", "0")]);
        let got = outcome(StatusCode::OK, &headers, &ok_body(), Some(&trailers));
        assert_eq!(got.code, Code::Ok);
        assert_eq!(
            got.response
                .and_then(|r| r.assertions)
                .map(|a| a.fully_qualified_method),
            Some(ECHO.to_owned())
        );

        let only = grpc_headers(&[("grpc-status", "12"), ("grpc-message", "no%20route")]);
        assert_eq!(
            outcome(StatusCode::OK, &only, b"", None),
            Outcome {
                code: Code::Unimplemented,
                message: "no route".to_owned(),
                response: None
            }
        );

        let got = outcome(StatusCode::OK, &headers, &ok_body(), None);
        assert_eq!(got.code, Code::Internal, "no trailers at all");
        let got = outcome(
            StatusCode::OK,
            &headers,
            &ok_body(),
            Some(&grpc_headers(&[])),
        );
        assert_eq!(got.code, Code::Unknown, "trailers without grpc-status");
        let bad = grpc_headers(&[("grpc-status", "zero")]);
        let got = outcome(StatusCode::OK, &headers, &ok_body(), Some(&bad));
        assert_eq!(got.code, Code::Internal, "a malformed grpc-status");
    }

    #[test]
    fn an_ok_status_needs_exactly_one_decodable_message() {
        let headers = grpc_headers(&[]);
        let trailers = grpc_headers(&[("grpc-status", "0")]);
        let code = |body: &[u8]| outcome(StatusCode::OK, &headers, body, Some(&trailers)).code;
        assert_eq!(code(&ok_body()), Code::Ok);
        assert_eq!(code(b""), Code::Internal, "no message");
        assert_eq!(
            code(&[ok_body(), ok_body()].concat()),
            Code::Internal,
            "two"
        );
        assert_eq!(code(&ok_body()[..6]), Code::Internal, "truncated");
        let mut compressed = ok_body().to_vec();
        compressed[0] = 1;
        assert_eq!(code(&compressed), Code::Internal, "compressed");
        assert_eq!(
            code(&[0, 0, 0, 0, 2, 0xFF, 0xFF]),
            Code::Internal,
            "garbage"
        );
    }

    #[test]
    fn resets_map_as_grpc_go_maps_them() {
        assert_eq!(code_of_reset(h2::Reason::REFUSED_STREAM), Code::Unavailable);
        assert_eq!(code_of_reset(h2::Reason::CANCEL), Code::Cancelled);
        assert_eq!(code_of_reset(h2::Reason::PROTOCOL_ERROR), Code::Internal);
        assert_eq!(code_of_reset(h2::Reason::NO_ERROR), Code::Internal);
        assert_eq!(
            code_of_reset(h2::Reason::ENHANCE_YOUR_CALM),
            Code::ResourceExhausted
        );
    }

    #[test]
    fn the_request_frame_of_an_empty_message_is_five_zero_bytes() {
        assert_eq!(frame(&EchoRequest {}).as_ref(), [0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_call_is_sent_with_grpc_go_headers_and_lower_case_metadata() {
        let call = Call {
            authority: "10.0.0.1:80".to_owned(),
            path: ECHO.to_owned(),
            metadata: vec![("Some-Other-Header".to_owned(), "one".to_owned())],
            timeout: Duration::from_secs(30),
        };
        let req = request(&call).expect("a request");
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(req.uri().to_string(), format!("http://10.0.0.1:80{ECHO}"));
        let headers: Vec<(&str, &str)> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().expect("ascii")))
            .collect();
        assert_eq!(
            headers,
            [
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("user-agent", USER_AGENT),
                ("grpc-timeout", "30000000u"),
                ("some-other-header", "one"),
            ]
        );
    }
}
