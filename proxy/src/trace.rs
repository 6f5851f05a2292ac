//! Request tracing (OpenTelemetry), when the process was started with an OTLP endpoint.
//!
//! A request gets a server span, parented to the caller's W3C `traceparent`/`tracestate` when
//! it sent one (else the sampler decides at the configured rate); every try at a backend gets
//! a client span under it (a retried request shows several), and so does every mirror copy;
//! each backend request carries a `traceparent` naming its client span, sampled or not, so the
//! backend continues the same trace. Attributes follow the HTTP semantic conventions; the
//! server span's status is an error on a 5xx answer, or on a gRPC error the proxy answered
//! itself that counts as one (sent as a 200 with a `grpc-status`), a client span's on a 4xx or
//! 5xx or a try that got no answer (the conventions' rule for each kind). The caller's
//! `tracestate` is kept up to the 512 characters W3C Trace Context asks to be passed on.
//!
//! Off, there is no [`RequestTracer`]: the handler's one check is whether it has one, and
//! nothing below it does tracing work; every function here takes an `Option` the caller
//! already holds as `None`. On, a request whose trace is not sampled still costs the context
//! extraction, the server span's ids and the injected header, but no client span, no span data
//! and no export: its backend requests carry the server span as their parent, which nothing
//! records either.

use crate::access_log::clip;
use crate::conn::ConnInfo;
use crate::forward::Upstream;
use http::{HeaderMap, HeaderValue, Method, Version};
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{Span as _, SpanContext, SpanKind, Status, TraceContextExt as _};
use opentelemetry::trace::{SpanId, TraceId, TraceState, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, Span};

/// Parsed once: a `&str` key is re-validated as a header name on every lookup.
static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
static CF_RAY: http::HeaderName = http::HeaderName::from_static("cf-ray");

/// Starts the spans of the proxy's requests; the proxy holds one exactly when tracing is on.
#[derive(Debug, Clone)]
pub struct RequestTracer {
    tracer: SdkTracer,
}

impl RequestTracer {
    pub fn new(tracer: SdkTracer) -> Self {
        Self { tracer }
    }

    /// The server span of a request that arrived with `parts` over `conn`, parented to the
    /// caller's `traceparent` when it sent a valid one.
    pub(crate) fn start(&self, parts: &http::request::Parts, conn: &ConnInfo) -> Box<RequestTrace> {
        let parent = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &Extractor(&parts.headers));
        let parent = kept_trace_state(&parts.headers, parent);
        let (name, method) = method_attributes(&parts.method);
        let mut server = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        if server.is_recording() {
            server.set_attribute(method);
            if name == "HTTP" {
                server.set_attribute(KeyValue::new(
                    "http.request.method_original",
                    kept(parts.method.as_str()),
                ));
            }
            server.set_attribute(KeyValue::new("url.path", kept(parts.uri.path())));
            server.set_attribute(KeyValue::new("url.scheme", conn.scheme));
            server.set_attribute(KeyValue::new(
                "network.protocol.version",
                protocol_version(parts.version),
            ));
            if let Some(peer) = conn.peer {
                server.set_attribute(KeyValue::new("client.address", peer.ip().to_string()));
            }
            if let Some(ua) = header_str(&parts.headers, &http::header::USER_AGENT) {
                server.set_attribute(KeyValue::new("user_agent.original", kept(ua)));
            }
            // The edge's id for the request, which Cloudflare's own logs carry too; a client
            // of the proxy's own listener could send anything.
            if conn.trusted_forwarding {
                if let Some(ray) = header_str(&parts.headers, &CF_RAY) {
                    server.set_attribute(KeyValue::new("cloudflare.ray_id", ray.to_owned()));
                }
            }
        }
        // Client spans only for a trace that is recorded: an unsampled one's backend requests
        // name the server span as their parent.
        let children = server
            .span_context()
            .is_sampled()
            .then(|| Context::new().with_remote_span_context(server.span_context().clone()));
        Box::new(RequestTrace {
            tracer: self.tracer.clone(),
            server,
            children,
            answering: None,
            failure: None,
        })
    }
}

/// The spans of one request: its server span, and the client span of the try that answered,
/// both ended when the response does (or is dropped).
#[derive(Debug)]
pub(crate) struct RequestTrace {
    tracer: SdkTracer,
    server: Span,
    /// Where client spans are started, under the server span; `None`: the trace is not
    /// sampled, and tries get no span of their own.
    children: Option<Context>,
    answering: Option<Box<Span>>,
    /// Why the proxy answered itself (`error.type`), when it did.
    failure: Option<&'static str>,
}

impl RequestTrace {
    /// The trace and span ids to log with the request, when the trace is sampled.
    pub(crate) fn ids(&self) -> Option<(TraceId, SpanId)> {
        let sc = self.server.span_context();
        sc.is_sampled().then(|| (sc.trace_id(), sc.span_id()))
    }

    /// The host the request was routed on.
    pub(crate) fn host(&mut self, host: &str) {
        if self.server.is_recording() {
            self.server
                .set_attribute(KeyValue::new("server.address", kept(host)));
        }
    }

    /// The rule that took the request (`ns/route/rule`) and its hostname pattern.
    pub(crate) fn matched(&mut self, route: Option<&str>, hostname: &str) {
        if self.server.is_recording() {
            if let Some(route) = route {
                self.server
                    .set_attribute(KeyValue::new("cftunnel.route", route.to_owned()));
            }
            self.server
                .set_attribute(KeyValue::new("cftunnel.hostname", hostname.to_owned()));
        }
    }

    /// The proxy answered the request itself, for `reason` (a stable label).
    pub(crate) fn failed(&mut self, reason: &'static str) {
        self.failure = Some(reason);
    }

    /// Starts the client span of a try at `upstream` (`resend`: tries before it) and puts its
    /// `traceparent` on the backend request.
    pub(crate) fn start_try(
        &self,
        req: &mut http::Request<crate::body::ProxyBody>,
        upstream: &Upstream,
        resend: u32,
    ) -> TrySpan {
        let mut span = self.client_span(req, upstream);
        if let Some(span) = span.as_mut().filter(|_| resend > 0) {
            span.set_attribute(KeyValue::new(
                "http.request.resend_count",
                i64::from(resend),
            ));
        }
        TrySpan(span.map(Box::new))
    }

    /// Starts the client span of a mirror copy sent to `upstream` and puts its `traceparent`
    /// on the copy.
    pub(crate) fn start_mirror(
        &self,
        req: &mut http::Request<crate::body::ProxyBody>,
        upstream: &Upstream,
    ) -> TrySpan {
        let mut span = self.client_span(req, upstream);
        if let Some(span) = span.as_mut() {
            span.set_attribute(KeyValue::new("cftunnel.mirror", true));
        }
        TrySpan(span.map(Box::new))
    }

    /// The client span of a backend request, when the trace is recorded; the request carries
    /// its `traceparent` (else the server span's).
    fn client_span(
        &self,
        req: &mut http::Request<crate::body::ProxyBody>,
        upstream: &Upstream,
    ) -> Option<Span> {
        let Some(children) = &self.children else {
            inject(self.server.span_context(), req.headers_mut());
            return None;
        };
        let (name, method) = method_attributes(req.method());
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .start_with_context(&self.tracer, children);
        if span.is_recording() {
            let backend = upstream.name();
            let path = clip(req.uri().path()).0;
            let mut url = String::with_capacity(backend.origin.len() + path.len());
            url.push_str(&backend.origin);
            url.push_str(path);
            span.set_attributes([
                method,
                KeyValue::new("server.address", backend.host.clone()),
                KeyValue::new("server.port", i64::from(backend.port)),
                KeyValue::new("url.full", url),
                KeyValue::new("network.protocol.version", protocol_version(req.version())),
            ]);
        }
        inject(span.span_context(), req.headers_mut());
        Some(span)
    }

    /// Keeps the answering try's span, to end with the response.
    pub(crate) fn answered_by(&mut self, span: TrySpan) {
        self.answering = span.0;
    }

    /// Ends the request's spans: its response ended (`aborted`: before its last byte) with
    /// `status` as the client saw it, and counts as `counted`: the status its failure has over
    /// HTTP when the proxy answered a gRPC call itself (a 200 with a `grpc-status`), which
    /// decides whether the span failed as it decides the request's status class.
    pub(crate) fn end(mut self, status: u16, counted: u16, aborted: bool) {
        if let Some(mut answering) = self.answering.take() {
            answering.end();
        }
        if self.server.is_recording() {
            // 0: dropped before any answer was known.
            if status > 0 {
                self.server.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
            }
            if aborted {
                self.server
                    .set_attribute(KeyValue::new("cftunnel.aborted", true));
            }
            if let Some(reason) = self.failure {
                self.server
                    .set_attribute(KeyValue::new("error.type", reason));
            }
            if counted >= 500 {
                if self.failure.is_none() {
                    self.server
                        .set_attribute(KeyValue::new("error.type", status_text(status)));
                }
                self.server.set_status(Status::error(""));
            }
        }
        self.server.end();
    }
}

/// A try's (or a mirror copy's) client span, ended by what became of it; empty when the
/// trace is not sampled. Boxed: a try's future carries it whether or not the trace is.
#[derive(Debug)]
pub(crate) struct TrySpan(Option<Box<Span>>);

impl TrySpan {
    /// The backend answered with `status`; the span goes on until the response ends.
    pub(crate) fn answered(&mut self, status: u16) {
        if let Some(span) = self.0.as_mut().filter(|s| s.is_recording()) {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 400 {
                span.set_attribute(KeyValue::new("error.type", status_text(status)));
                span.set_status(Status::error(""));
            }
        }
    }

    /// The try got no answer: `reason` is the error's label (`dial`, `timeout`, ...).
    pub(crate) fn failed(self, reason: &'static str) {
        if let Some(mut span) = self.0 {
            if span.is_recording() {
                span.set_attribute(KeyValue::new("error.type", reason));
                span.set_status(Status::error(reason));
            }
            span.end();
        }
    }

    pub(crate) fn end(self) {
        if let Some(mut span) = self.0 {
            span.end();
        }
    }
}

/// Puts `traceparent` (and `tracestate`, when there is one) naming `sc` on a request,
/// replacing the caller's (W3C Trace Context §3).
fn inject(sc: &SpanContext, headers: &mut HeaderMap) {
    if !sc.is_valid() {
        return;
    }
    // `00-{trace id}-{span id}-{flags}`, written by hand: `core::fmt` would cost more than
    // the rest of an unsampled request's tracing.
    let mut buf = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex_into(&mut buf[3..35], &sc.trace_id().to_bytes());
    hex_into(&mut buf[36..52], &sc.span_id().to_bytes());
    hex_into(&mut buf[53..55], &[sc.trace_flags().to_u8() & 1]);
    if let Ok(v) = HeaderValue::from_bytes(&buf) {
        headers.insert(&TRACEPARENT, v);
    }
    let state = sc.trace_state();
    if *state == TraceState::NONE {
        headers.remove(&TRACESTATE);
        return;
    }
    match HeaderValue::try_from(state.header()) {
        Ok(v) if !v.is_empty() => {
            headers.insert(&TRACESTATE, v);
        }
        _ => {
            headers.remove(&TRACESTATE);
        }
    }
}

/// Most of a caller's `tracestate` kept, in characters: the least W3C Trace Context asks a
/// vendor to pass on (§3.3.1.5). A caller may send 32 entries of over 500 characters each, and
/// the server span and every client span would each hold them while queued for export.
const MAX_TRACE_STATE: usize = 512;

/// Entries longer than this are dropped first when a `tracestate` is cut (W3C Trace Context
/// §3.3.1.5).
const LONG_TRACE_STATE_ENTRY: usize = 128;

/// `parent`, with its `tracestate` cut to [`MAX_TRACE_STATE`] characters when it is longer.
fn kept_trace_state(headers: &HeaderMap, parent: Context) -> Context {
    // What the propagator parsed is never longer than the header it came from.
    if headers
        .get(&TRACESTATE)
        .is_none_or(|v| v.len() <= MAX_TRACE_STATE)
    {
        return parent;
    }
    let sc = parent.span().span_context().clone();
    let Some(state) = cut_trace_state(sc.trace_state()) else {
        return parent;
    };
    Context::new().with_remote_span_context(SpanContext::new(
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags(),
        sc.is_remote(),
        state,
    ))
}

/// `state` cut to at most [`MAX_TRACE_STATE`] characters by whole entries, as W3C Trace
/// Context says (§3.3.1.5): those over [`LONG_TRACE_STATE_ENTRY`] characters first, then from
/// the end. `None` when it is short enough as it is.
fn cut_trace_state(state: &TraceState) -> Option<TraceState> {
    // `key=value`, and a comma between two entries.
    let sizes: Vec<usize> = state
        .into_iter()
        .map(|(k, v)| k.len() + 1 + v.len())
        .collect();
    let mut length = sizes.iter().sum::<usize>() + sizes.len().saturating_sub(1);
    if length <= MAX_TRACE_STATE {
        return None;
    }
    let mut kept = vec![true; sizes.len()];
    for long_only in [true, false] {
        for (i, &size) in sizes.iter().enumerate().rev() {
            if length <= MAX_TRACE_STATE {
                break;
            }
            if kept[i] && (!long_only || size > LONG_TRACE_STATE_ENTRY) {
                kept[i] = false;
                length = length.saturating_sub(size + 1);
            }
        }
    }
    let entries = state
        .into_iter()
        .zip(kept)
        .filter_map(|(entry, kept)| kept.then_some(entry));
    // Entries the propagator parsed: valid still.
    Some(TraceState::from_key_value(entries).unwrap_or_default())
}

/// Lower-case hex of `bytes` into `out`, two digits a byte.
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// A span's name and its `http.request.method`: the method when the conventions know it,
/// else `HTTP` and `_OTHER`.
fn method_attributes(method: &Method) -> (&'static str, KeyValue) {
    let known = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => return ("HTTP", KeyValue::new("http.request.method", "_OTHER")),
    };
    (known, KeyValue::new("http.request.method", known))
}

fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

fn status_text(status: u16) -> String {
    status.to_string()
}

/// The request's headers as the propagator reads them.
struct Extractor<'a>(&'a HeaderMap);

impl opentelemetry::propagation::Extractor for Extractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// An attribute value of the request's own text, cut as the access log cuts it: the export
/// queue holds a number of spans, whatever their size, and a client can send tens of KiB of
/// path or user agent.
fn kept(text: &str) -> String {
    clip(text).0.to_owned()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceFlags;

    #[test]
    fn the_injected_traceparent_names_the_span_and_its_sampling() {
        let sc = SpanContext::new(
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
            SpanId::from(0x00f0_67aa_0ba9_02b7),
            TraceFlags::SAMPLED,
            false,
            "vendor=x".parse::<TraceState>().expect("trace state"),
        );
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static("00-caller-01"));
        headers.insert("tracestate", HeaderValue::from_static("old=1"));
        inject(&sc, &mut headers);
        assert_eq!(
            headers["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(headers["tracestate"], "vendor=x");
        let unsampled = SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            TraceFlags::default(),
            false,
            TraceState::default(),
        );
        inject(&unsampled, &mut headers);
        assert_eq!(
            headers["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
        assert!(headers.get("tracestate").is_none());
    }

    #[test]
    fn unknown_methods_are_other_as_the_conventions_say() {
        assert_eq!(method_attributes(&Method::GET).0, "GET");
        let (name, attr) = method_attributes(&Method::from_bytes(b"PURGE").expect("method"));
        assert_eq!(name, "HTTP");
        assert_eq!(attr.value.as_str(), "_OTHER");
    }
}
