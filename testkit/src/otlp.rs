//! An OpenTelemetry collector's trace receiver, for tests: OTLP/HTTP (`POST /v1/traces`,
//! protobuf) and OTLP/gRPC (`TraceService/Export` over HTTP/2 with prior knowledge) on one
//! port on 127.0.0.1. Every span received is decoded with `opentelemetry-proto`'s own
//! `ExportTraceServiceRequest` and kept as a [`RecordedSpan`].
//!
//! [`OtlpReceiver::stalled`] accepts exports and never answers, as a collector that hangs.
//! A collector that is down is a port nothing listens on.
//!
//! Left out: OTLP/JSON, compressed payloads (refused, as a collector without the codec
//! would), partial-success answers, logs and metrics.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The gRPC method OTLP exporters call.
pub const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The OTLP/HTTP path for traces.
pub const HTTP_EXPORT_PATH: &str = "/v1/traces";
/// Largest export accepted.
const MAX_EXPORT: usize = 16 * 1024 * 1024;

/// How a span ended, as OTLP says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanStatus {
    Unset,
    Ok,
    Error,
}

/// A span's kind, as OTLP says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Bool(bool),
    Double(f64),
    /// Arrays, maps and bytes, as their debug text.
    Other(String),
}

/// One span as a collector received it. Ids are lower-case hex; a root span's
/// `parent_span_id` is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub trace_state: String,
    pub name: String,
    pub kind: SpanKind,
    pub status: SpanStatus,
    pub status_message: String,
    pub attributes: BTreeMap<String, AttrValue>,
    /// The exporting process's resource (`service.name`, ...).
    pub resource: BTreeMap<String, AttrValue>,
    /// The instrumentation scope's name.
    pub scope: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    /// The span's events by name.
    pub events: Vec<String>,
}

impl RecordedSpan {
    /// A string attribute's value.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key)? {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An integer attribute's value.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key)? {
            AttrValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// A boolean attribute's value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.attributes.get(key)? {
            AttrValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A string resource attribute's value.
    pub fn resource_str(&self, key: &str) -> Option<&str> {
        match self.resource.get(key)? {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// How the receiver answers exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Record,
    /// Read nothing, answer nothing: a collector that hangs.
    Stall,
}

#[derive(Debug, Default)]
struct State {
    spans: Vec<RecordedSpan>,
    /// Export requests answered, by transport.
    http_exports: usize,
    grpc_exports: usize,
}

/// A running receiver. Dropping it stops the listener and its connections.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    received: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// Listens on a free port of 127.0.0.1 and records every span exported to it, over
    /// OTLP/HTTP or OTLP/gRPC.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_in(Mode::Record).await
    }

    /// Accepts exports on a free port of 127.0.0.1 and never answers them.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub async fn stalled() -> std::io::Result<Self> {
        Self::start_in(Mode::Stall).await
    }

    async fn start_in(mode: Mode) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (notify, received) = watch::channel(0);
        let notify = Arc::new(notify);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                let notify = notify.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        let notify = notify.clone();
                        async move { Ok::<_, Infallible>(answer(req, mode, &state, &notify).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            state,
            received,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL exporters are given (`OTEL_EXPORTER_OTLP_ENDPOINT`), for either transport.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<RecordedSpan> {
        self.state
            .lock()
            .map(|s| s.spans.clone())
            .unwrap_or_default()
    }

    /// Export requests answered so far over OTLP/HTTP and over gRPC.
    pub fn exports(&self) -> (usize, usize) {
        self.state
            .lock()
            .map(|s| (s.http_exports, s.grpc_exports))
            .unwrap_or_default()
    }

    /// Waits until at least `count` spans have arrived, at most `within`; returns every span
    /// received by then, however many.
    pub async fn wait_for(&self, count: usize, within: Duration) -> Vec<RecordedSpan> {
        let mut received = self.received.clone();
        let _ = tokio::time::timeout(within, received.wait_for(|n| *n >= count)).await;
        self.spans()
    }
}

type Reply = Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut res = Response::new(Full::new(body).boxed());
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    res
}

async fn answer(
    req: Request<Incoming>,
    mode: Mode,
    state: &Mutex<State>,
    notify: &watch::Sender<usize>,
) -> Reply {
    if mode == Mode::Stall {
        std::future::pending::<()>().await;
    }
    let grpc = req.uri().path() == GRPC_EXPORT_PATH;
    if !grpc && req.uri().path() != HTTP_EXPORT_PATH {
        return reply(StatusCode::NOT_FOUND, "text/plain", Bytes::new());
    }
    if req.method() != http::Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Bytes::new());
    }
    let encoded = req
        .headers()
        .get(if grpc {
            "grpc-encoding"
        } else {
            "content-encoding"
        })
        .is_some_and(|v| v.as_bytes() != b"identity");
    let body = match http_body_util::Limited::new(req.into_body(), MAX_EXPORT)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, "text/plain", Bytes::new()),
    };
    let message = if grpc {
        // One length-prefixed message: a compression flag, a big-endian length, the bytes.
        match body.get(..5) {
            Some(&[0, a, b, c, d])
                if body.len() == 5 + u32::from_be_bytes([a, b, c, d]) as usize =>
            {
                body.slice(5..)
            }
            _ => return grpc_status(13, "malformed gRPC message"),
        }
    } else {
        body
    };
    if encoded {
        return if grpc {
            grpc_status(12, "compression not supported")
        } else {
            reply(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "text/plain",
                Bytes::new(),
            )
        };
    }
    let Ok(request) = ExportTraceServiceRequest::decode(message) else {
        return if grpc {
            grpc_status(3, "not an ExportTraceServiceRequest")
        } else {
            reply(StatusCode::BAD_REQUEST, "text/plain", Bytes::new())
        };
    };
    let spans = record(request);
    let total = {
        let Ok(mut s) = state.lock() else {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                Bytes::new(),
            );
        };
        s.spans.extend(spans);
        if grpc {
            s.grpc_exports += 1;
        } else {
            s.http_exports += 1;
        }
        s.spans.len()
    };
    notify.send_replace(total);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    if grpc {
        let mut framed = BytesMut::with_capacity(5 + answer.len());
        framed.put_u8(0);
        framed.put_u32(answer.len() as u32);
        framed.put_slice(&answer);
        grpc_answer(framed.freeze(), 0, "")
    } else {
        reply(
            StatusCode::OK,
            "application/x-protobuf",
            Bytes::from(answer),
        )
    }
}

fn grpc_status(code: u8, message: &'static str) -> Reply {
    grpc_answer(Bytes::new(), code, message)
}

/// A gRPC answer: 200, the message (if any), then the status in trailers.
fn grpc_answer(message: Bytes, code: u8, text: &'static str) -> Reply {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if !text.is_empty() {
        trailers.insert("grpc-message", HeaderValue::from_static(text));
    }
    let mut frames = Vec::with_capacity(2);
    if !message.is_empty() {
        frames.push(Ok(Frame::data(message)));
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let body = StreamBody::new(futures_util::stream::iter(frames));
    let mut res = Response::new(body.boxed());
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    res
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, AttrValue> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => AttrValue::Str(s.clone()),
                Some(any_value::Value::IntValue(i)) => AttrValue::Int(*i),
                Some(any_value::Value::BoolValue(b)) => AttrValue::Bool(*b),
                Some(any_value::Value::DoubleValue(d)) => AttrValue::Double(*d),
                other => AttrValue::Other(format!("{other:?}")),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn record(request: ExportTraceServiceRequest) -> Vec<RecordedSpan> {
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind as Kind;
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode as Code;
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for span in scope_spans.spans {
                let kind = match Kind::try_from(span.kind) {
                    Ok(Kind::Internal) => SpanKind::Internal,
                    Ok(Kind::Server) => SpanKind::Server,
                    Ok(Kind::Client) => SpanKind::Client,
                    Ok(Kind::Producer) => SpanKind::Producer,
                    Ok(Kind::Consumer) => SpanKind::Consumer,
                    _ => SpanKind::Unspecified,
                };
                let (status, status_message) = match &span.status {
                    Some(s) => (
                        match Code::try_from(s.code) {
                            Ok(Code::Ok) => SpanStatus::Ok,
                            Ok(Code::Error) => SpanStatus::Error,
                            _ => SpanStatus::Unset,
                        },
                        s.message.clone(),
                    ),
                    None => (SpanStatus::Unset, String::new()),
                };
                out.push(RecordedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    trace_state: span.trace_state.clone(),
                    name: span.name.clone(),
                    kind,
                    status,
                    status_message,
                    attributes: attrs(&span.attributes),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    events: span.events.iter().map(|e| e.name.clone()).collect(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
