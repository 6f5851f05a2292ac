//! The request handler: what happens to a request between its arrival and its response head.
//!
//! [`Proxy::handle`] is what both the standalone listener and the tunnel connector call for
//! every request. It loads the route table once, and everything the request touches after
//! that comes from that snapshot, so in-flight requests finish on the table they started with.
//!
//! In order: host and path made canonical, route lookup, the rule's Cloudflare Access check
//! ([`crate::access`]), redirects and CORS preflights
//! answered locally, backend choice, request filters, mirror copies
//! ([`crate::forward::mirror`]), tries ([`crate::forward::retry`]) and response filters. A
//! WebSocket `101` goes to [`crate::upgrade`]; the response body ([`crate::response`])
//! completes the request's accounting (`completion`) when it ends. Failures become
//! responses in [`crate::error`].

use crate::access_log::{AccessLog, AccessLogOptions};
use crate::body::{self, BoxError};
use crate::completion::{Completion, Recorder};
use crate::error::{GrpcAnswer, ProxyError};
use crate::filter::{Cors, Filters};
use crate::forward::mirror::Mirrors;
use crate::forward::payload::Payload;
use crate::forward::retry::{self, Tries, TryTimeout};
use crate::forward::{ForwardError, UpstreamBody};
use crate::headers::{
    announce_grpc_trailers, only_chunked_coding, prepare_forward_headers, settle_forwarded_proto,
    strip_hop_by_hop, takes_trailers,
};
use crate::metrics::ProxyMetrics;
use crate::response::{Bounds, ResponseBody};
use crate::route::RequestView;
use crate::routes::{retire, LiveRoutes};
use crate::rule::Rule;
use crate::trace::RequestTracer;
use crate::upgrade::{Sessions, Upgrade};
use bytes::Bytes;
use http::header;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use http_body::Body;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

// Types the handler takes and hands on, at the paths they have always had.
pub use crate::conn::ConnInfo;
pub use crate::forward::mirror::MAX_MIRRORS_IN_FLIGHT;
pub use crate::forward::payload::MAX_REPLAY_BODY;
pub use crate::routes::Routes;
pub use crate::upgrade::{ClientUpgrade, SessionHold, SessionLimits, UpgradedIo};

/// Settings of the request path that do not change with config pushes.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Wait for a backend's response head when the rule sets no backend timeout.
    pub backend_header_timeout: Duration,
    /// How long a request body may send nothing before any response comes ([`body::Quiet`]).
    pub request_body_timeout: Duration,
    pub access_log: bool,
    /// What the access log's lines carry and how many are written.
    pub access_log_options: AccessLogOptions,
    /// Starts each request's spans; `None`: tracing is off.
    pub tracer: Option<RequestTracer>,
    /// When an upgraded (WebSocket) session is ended by the proxy.
    pub sessions: SessionLimits,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            backend_header_timeout: Duration::from_secs(60),
            request_body_timeout: Duration::from_secs(60),
            access_log: false,
            access_log_options: AccessLogOptions::default(),
            tracer: None,
            sessions: SessionLimits::default(),
        }
    }
}

/// What every clone of a [`Proxy`] shares.
#[derive(Debug)]
struct Shared {
    /// The table in service, loaded once per request.
    routes: LiveRoutes,
    metrics: ProxyMetrics,
    mirrors: Mirrors,
    /// Where each request's completion is recorded.
    recorder: Arc<Recorder>,
    /// Upgraded sessions open now, for the drain to wait for.
    sessions: Sessions,
    /// Bounds a try's response head when its rule sets no backend timeout.
    header_timeout: Duration,
    body_timeout: Duration,
}

/// The proxy's request handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy serving `routes` (usually the empty table until the first push).
    pub fn new(routes: Routes, metrics: ProxyMetrics, options: ProxyOptions) -> Self {
        let mirrors = Mirrors::new(metrics.mirrors_dropped.clone());
        let sessions = Sessions::new(metrics.websocket_sessions.clone(), options.sessions);
        let recorder = Recorder::new(
            metrics.in_flight.clone(),
            options.access_log.then(|| {
                AccessLog::spawn(
                    options.access_log_options,
                    metrics.access_log_dropped.clone(),
                    metrics.access_log_queued.clone(),
                )
            }),
            options.tracer,
        );
        Self {
            shared: Arc::new(Shared {
                routes: LiveRoutes::new(routes),
                metrics,
                mirrors,
                recorder: Arc::new(recorder),
                sessions,
                header_timeout: options.backend_header_timeout,
                body_timeout: options.request_body_timeout,
            }),
        }
    }

    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// The table being served now.
    pub fn routes(&self) -> Arc<Routes> {
        self.shared.routes.load_full()
    }

    /// Whether a config has been loaded since start.
    pub fn is_loaded(&self) -> bool {
        self.shared.routes.is_loaded()
    }

    /// Swaps in a new table; requests already running keep theirs.
    pub fn swap(&self, routes: Routes) {
        self.shared.metrics.config_version.set(routes.version);
        let old = self.shared.routes.swap(routes);
        let shared = self.shared.clone();
        retire(old, self.shared.metrics.clone(), move || {
            shared.routes.load_full()
        });
    }

    /// Resolves once no upgraded (WebSocket) session is open, at once when none is. Sessions
    /// outlive the requests that opened them, which end at their `101`; a drain waits for
    /// both.
    pub async fn sessions_closed(&self) {
        self.shared.sessions.closed().await;
    }

    /// Changes each time a table is swapped in (once per applied push).
    pub fn swaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.routes.swaps()
    }

    /// Serves one request. Never fails: every error becomes a response here.
    pub async fn handle<B>(&self, req: Request<B>, conn: ConnInfo) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let start = Instant::now();
        let routes = self.shared.routes.load_full();
        let (parts, body) = req.into_parts();
        let grpc_answer = GrpcAnswer::of(&parts.headers);
        // Trailers reach a client over HTTP/2, and through the tunnel one that asks for them
        // (`TE: trailers`, as every gRPC client does). Over HTTP/1.1 hyper writes only trailers
        // a `Trailer` header announced, and a cut body must show as one, so those are cut; so
        // are gRPC-Web's, whose status would have to be a frame of the body, which may be
        // cut mid-message.
        let trailers_at_deadline = grpc_answer.is_some_and(|a| !a.is_web())
            && (parts.version == http::Version::HTTP_2
                || (conn.trusted_forwarding
                    && parts
                        .headers
                        .get(http::header::TE)
                        .is_some_and(|te| te.as_bytes().eq_ignore_ascii_case(b"trailers"))));
        let head = parts.method == http::Method::HEAD;
        let mut completion = Completion::start(&self.shared.recorder, &parts, &conn, start);
        let mut cors = CorsAnswer::default();
        let result = self
            .route(&routes, parts, body, conn, &mut completion, &mut cors)
            .await;
        let (response, counted) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                (response, status)
            }
            Err(err) => {
                completion.failed(err.label());
                if let Some(reason) = err.backend_reason() {
                    routes
                        .host_metrics(completion.bucket())
                        .backend_error(reason)
                        .inc();
                    tracing::debug!(
                        hostname = routes.host_label(completion.bucket()),
                        error = %err,
                        "backend error"
                    );
                }
                let (status, headers, reason) = err.head(grpc_answer);
                // A HEAD answer carries no body: one the server leaves unread would count the
                // request as cut off.
                let body = if head { "" } else { reason };
                let mut response = Response::new(Reply::Local(Bytes::from_static(body.as_bytes())));
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                cors.decorate(response.headers_mut());
                // Counted in the metrics by the status the failure has over HTTP: a gRPC
                // answer's is 200 (its `grpc-status` says what failed), and a backend that is
                // down would count as served. The log line and the span keep the 200 sent.
                (response, err.status().as_u16())
            }
        };
        completion.answered(response.status().as_u16(), counted, || {
            routes.host_metrics(None).clone()
        });
        response.map(|reply| match reply {
            Reply::Upstream(body, bounds) => {
                ResponseBody::upstream(body, completion, bounds, trailers_at_deadline)
            }
            Reply::Local(bytes) => ResponseBody::local(bytes, Some(completion)),
        })
    }

    async fn route<'r, B>(
        &self,
        routes: &'r Routes,
        mut parts: http::request::Parts,
        body: B,
        conn: ConnInfo,
        completion: &mut Completion,
        cors: &mut CorsAnswer<'r>,
    ) -> Result<Response<Reply>, ProxyError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        // hyper frames a `gzip, chunked` body by its chunks and leaves the gzip to the handler:
        // passed on, the backend would read the coded bytes as the body. (A body of known
        // length has no transfer coding: the common request is not looked up.)
        if body.size_hint().exact().is_none() && !only_chunked_coding(&parts.headers) {
            return Err(ProxyError::UnsupportedTransferCoding);
        }
        let conn = settle_forwarded_proto(&mut parts.headers, conn);
        if parts.version == http::Version::HTTP_2 {
            cftunnel_config::hop_by_hop::join_cookie_crumbs(&mut parts.headers);
        }
        // The host routed on is the host the backend sees: an absolute-form target or an
        // HTTP/2 `:authority` wins over a `Host` header (RFC 9112 §3.2.2).
        // Userinfo has no place in a request's host (RFC 9110 §4.2.4, RFC 9113 §8.3.1): the
        // host is read after its `@`, where a backend might read it before.
        const USERINFO: &str = "userinfo in the request's host\n";
        if let Some(authority) = parts.uri.authority() {
            if authority.as_str().contains('@') {
                return Err(ProxyError::BadRequest(USERINFO));
            }
            // A tunnelled request comes with the one `Host` its URI names: nothing to replace.
            let mut hosts = parts.headers.get_all(header::HOST).iter();
            let named = hosts
                .next()
                .is_some_and(|h| h.as_bytes() == authority.as_str().as_bytes())
                && hosts.next().is_none();
            if !named {
                if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
                    parts.headers.insert(header::HOST, v);
                }
            }
        } else {
            let mut hosts = parts.headers.get_all(header::HOST).iter();
            match (hosts.next(), hosts.next()) {
                // Routed on one, a backend might read the other (RFC 9112 §3.2: answer 400).
                (Some(_), Some(_)) => {
                    return Err(ProxyError::BadRequest("more than one Host header\n"));
                }
                (Some(host), None) if host.as_bytes().contains(&b'@') => {
                    return Err(ProxyError::BadRequest(USERINFO));
                }
                // Routed on its suffix (`evil.test/.example.com` ends in `.example.com`), such
                // a host would reach a backend that builds links from it; Go's server answers
                // 400 too.
                (Some(host), None)
                    if !host.as_bytes().iter().all(|&b| HOST_BYTE[usize::from(b)]) =>
                {
                    return Err(ProxyError::BadRequest("malformed Host header\n"));
                }
                // An HTTP/1.1 request must name its host (RFC 9112 §3.2: answer 400); the
                // backend would see its own address instead.
                (None, _) if parts.version == http::Version::HTTP_11 => {
                    return Err(ProxyError::BadRequest("no Host header\n"));
                }
                _ => {}
            }
        }
        if parts.uri.path() != "*" {
            // Rules are written in the same canonical form (`cftunnel_config::path`). A `%`
            // that starts no escape would let decoding make new ones (`%2%65` is `%2e` once
            // `%65` is decoded); Go's server refuses such a path too.
            let canonical = cftunnel_config::path::canonical(parts.uri.path()).map_err(|_| {
                ProxyError::BadRequest(
                    "the request path has a `%` not followed by two hex digits\n",
                )
            })?;
            if let Some(normal) = canonical {
                let pq = match parts.uri.query() {
                    Some(q) => format!("{normal}?{q}"),
                    None => normal,
                };
                let mut uri = std::mem::take(&mut parts.uri).into_parts();
                uri.path_and_query =
                    Some(http::uri::PathAndQuery::try_from(pq).map_err(|_| {
                        ProxyError::BadRequest("request path cannot be normalised\n")
                    })?);
                parts.uri = Uri::from_parts(uri)
                    .map_err(|_| ProxyError::BadRequest("request path cannot be normalised\n"))?;
            }
        }
        let host = request_host(&parts);
        completion.log_host(&host);
        let view = RequestView {
            method: &parts.method,
            path: parts.uri.path(),
            query: parts.uri.query(),
            headers: &parts.headers,
        };
        let hit = routes.table.find(&host, &view).ok_or_else(|| {
            // A pod that has never been given a config cannot know the route yet: not "no
            // route" (404), but a gateway that cannot serve it.
            if self.is_loaded() {
                ProxyError::NoRoute
            } else {
                ProxyError::NoConfig
            }
        })?;
        completion.matched(
            hit.bucket.id,
            routes.host_metrics(Some(hit.bucket.id)).clone(),
        );
        let rule: &Rule = hit.rule;
        completion.log_route(rule.name.as_deref(), routes.host_label(Some(hit.bucket.id)));
        cors.add(rule.filters.cors.as_deref(), &parts.headers);
        // The request timeout bounds the whole exchange from the request's arrival: the access
        // check (which may wait for its keys) and reading a buffered body too.
        let deadline = rule.request_timeout.map(|t| completion.started() + t);
        let identity = match &rule.access {
            Some(access) => {
                let check = access.check(&parts.headers);
                let checked = match deadline {
                    Some(at) => tokio::time::timeout_at(at, check)
                        .await
                        .map_err(|_| ProxyError::RequestTimeout)?,
                    None => check.await,
                };
                Some(checked.map_err(ProxyError::AccessDenied)?)
            }
            None => None,
        };
        if let Some(status) = rule.unavailable {
            return Err(ProxyError::Unavailable(status));
        }
        let matched_prefix = hit.matched.path.prefix();

        if let Some(response) =
            answer_locally(&rule.filters, &parts, &host, conn, matched_prefix, cors)
        {
            return Ok(response);
        }
        let backend = rule.backends.pick().ok_or(ProxyError::NoBackend)?;
        cors.add(backend.filters.cors.as_deref(), &parts.headers);
        if let Some(response) =
            answer_locally(&backend.filters, &parts, &host, conn, matched_prefix, cors)
        {
            return Ok(response);
        }
        if let Some(status) = backend.unavailable {
            return Err(ProxyError::Unavailable(status));
        }
        let upstream = backend.upstream.as_ref().ok_or(ProxyError::NoBackend)?;

        let upgrade = Upgrade::take(&mut parts);
        if upgrade.is_some() && body.is_end_stream() {
            // The handshake goes out without a body, whatever length a client (or the edge)
            // declared: a stated length with no body after it would make a backend that does
            // not switch read the next request on the connection as this one's body.
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.remove(header::TRANSFER_ENCODING);
        }
        // The client's hop-by-hop headers go before the filters run: a `Connection` header
        // naming a header cannot remove one a filter set.
        prepare_forward_headers(&mut parts.headers, conn, upgrade.is_some());
        if let Some(identity) = identity {
            identity.forward(&mut parts.headers);
        }
        rule.filters.apply_request(&mut parts, matched_prefix);
        backend.filters.apply_request(&mut parts, matched_prefix);

        let host_metrics = routes.host_metrics(Some(hit.bucket.id));
        let counted = body::Counted::new(body, host_metrics.request_bytes.clone());
        // gRPC streams are left alone: a call's messages come when its peer has something to
        // say, and many servers send their response headers only with their first message.
        // Only over HTTP/2, though: the client's word alone must not lift a bound on a request
        // to an HTTP/1.1 backend. An `h2c` backend always speaks HTTP/2; a TLS one offered
        // `h2` says with each connection, so the bounds it lifts are lifted by the try that
        // goes out on a connection where it picked it.
        let grpc = is_grpc(&parts.headers);
        // A client of the proxy's own HTTP/1.1 listener gets a gRPC backend's trailers only if
        // the response announces them (the tunnel carries them its own way). `TE` is still
        // here only as `trailers`, which is what gRPC clients send.
        let announce_trailers = grpc
            && parts.version == http::Version::HTTP_11
            && !conn.trusted_forwarding
            && takes_trailers(&parts.headers);
        let unbounded = grpc && upstream.always_http2();
        let quiet =
            (!counted.is_end_stream() && !unbounded).then(|| Arc::new(body::QuietState::default()));
        let counted = body::Quiet::new(counted, self.shared.body_timeout, quiet.clone());
        let stalled = || quiet.as_ref().is_some_and(|q| q.expired());
        let replay_needed = rule.retry.is_some()
            || !rule.filters.mirrors.is_empty()
            || !backend.filters.mirrors.is_empty();
        let read = Payload::read(counted, replay_needed, !grpc);
        let read = match deadline {
            Some(at) => tokio::time::timeout_at(at, read)
                .await
                .map_err(|_| ProxyError::RequestTimeout)?,
            None => read.await,
        };
        let body = match read {
            Ok(body) if grpc => body.lifted_over_http2(quiet.clone()),
            Ok(body) => body,
            Err(_) if stalled() => return Err(ProxyError::BodyTimeout),
            Err(e) => return Err(e.into()),
        };

        let mirrors = rule
            .filters
            .mirrors
            .iter()
            .chain(backend.filters.mirrors.iter());
        match body.replayable() {
            // A session cannot be mirrored: a copy of its handshake would open one on the
            // mirror only to drop it at once.
            _ if upgrade.is_some() => {}
            Some(bytes) => {
                for mirror in mirrors {
                    self.shared.mirrors.send(
                        &mirror.upstream,
                        mirror.share,
                        &parts,
                        bytes.clone(),
                        completion.trace(),
                    );
                }
            }
            None => {
                for mirror in mirrors {
                    self.shared.mirrors.count_unsent(mirror.share);
                }
            }
        }

        let grpc_deadline = grpc.then(|| grpc_timeout(&parts.headers));
        let timeout = TryTimeout::of(rule, self.shared.header_timeout, grpc_deadline);
        let sent = completion.logging().then(Instant::now);
        let mut tries = Tries::default();
        let exchange = retry::exchange(
            upstream,
            parts,
            body,
            timeout,
            rule.retry.as_ref(),
            || rule.backends.retry_target(backend),
            host_metrics,
            &mut tries,
            completion.trace_mut(),
        );
        let answer = match deadline {
            // Out of time waiting on the backend: a backend timeout, counted as one.
            Some(at) => tokio::time::timeout_at(at, exchange)
                .await
                .unwrap_or(Err(ForwardError::Timeout.into())),
            None => exchange.await,
        };
        completion.log_tries(&tries, sent);
        let (mut response, try_deadline) = match answer {
            Ok(answer) => answer,
            Err(_) if stalled() => return Err(ProxyError::BodyTimeout),
            Err(e) => return Err(e.into()),
        };
        if let Some(quiet) = &quiet {
            quiet.answered();
        }
        // A body coded other than by `chunked` would reach the client as if it were the body
        // itself, its coding stripped with the framing: an invalid response (RFC 9112 §6.1).
        if response.body().size_hint().exact().is_none() && !only_chunked_coding(response.headers())
        {
            return Err(
                ForwardError::InvalidResponse("transfer coding other than chunked".into()).into(),
            );
        }
        // The client is answered in the proxy's HTTP, whatever the backend spoke (RFC 9110
        // §6.2): an HTTP/1.0 backend's version passed on would end an HTTP/1.1 client's
        // keep-alive. hyper still answers an HTTP/1.0 client as one, and HTTP/2 has no version
        // line.
        *response.version_mut() = http::Version::HTTP_11;

        let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        // A handshake the backend refused: the body of its refusal may send nothing for no
        // longer than the wait for a head. A backend that holds the connection after a
        // partial refusal would otherwise hold the client, the connection and the request in
        // flight for good when the rule sets no timeout.
        let stall = timeout.header.filter(|_| upgrade.is_some() && !switched);
        if switched {
            match upgrade {
                // Only WebSocket is spliced: a backend that switched to anything else would
                // get the client's later bytes past routing and filters.
                Some(upgrade) if crate::upgrade::switched_to_websocket(response.headers()) => {
                    upgrade.splice(&mut response, &self.shared.sessions);
                }
                // A switch to a protocol the request did not ask for (RFC 9110 §15.2.2): the
                // client's connection stays HTTP, and the backend's, no longer HTTP, is
                // dropped with the response.
                _ => return Err(ProxyError::BadUpgrade),
            }
        } else {
            strip_hop_by_hop(response.headers_mut(), false);
            if announce_trailers {
                announce_grpc_trailers(response.headers_mut());
            }
        }
        rule.filters.apply_response(response.headers_mut());
        backend.filters.apply_response(response.headers_mut());
        cors.decorate(response.headers_mut());
        // The body ends by the earlier of the request's deadline and the answering try's. An
        // upgraded exchange outlives both: its bytes are spliced, not this body.
        let deadline = match (deadline, try_deadline) {
            (Some(request), Some(try_end)) => Some(request.min(try_end)),
            (request, try_end) => request.or(try_end),
        }
        .filter(|_| !switched);
        let bounds = Bounds { deadline, stall };
        Ok(response.map(|body| Reply::Upstream(body, bounds)))
    }
}

/// The CORS filters of the rule and backend a request matched, with the request's `Origin`.
/// Every answer after the match carries their headers, the proxy's own too (a backend down, a
/// timeout, a rule's unavailable status, an Access refusal): without them a browser hides the
/// answer, and a gRPC-web client sees a network error instead of its `grpc-status`.
#[derive(Default)]
struct CorsAnswer<'r> {
    origin: Option<HeaderValue>,
    filters: [Option<&'r Cors>; 2],
}

impl<'r> CorsAnswer<'r> {
    /// Takes in a matched rule's or backend's filter, if it has one.
    fn add(&mut self, cors: Option<&'r Cors>, request: &HeaderMap) {
        let Some(cors) = cors else { return };
        if self.origin.is_none() {
            self.origin = request.get(header::ORIGIN).cloned();
        }
        if let Some(free) = self.filters.iter_mut().find(|f| f.is_none()) {
            *free = Some(cors);
        }
    }

    fn decorate(&self, response: &mut HeaderMap) {
        let Some(origin) = &self.origin else { return };
        for cors in self.filters.iter().flatten() {
            cors.decorate(origin, response);
        }
    }
}

/// A response body before it is wrapped for accounting.
enum Reply {
    /// A backend's body and what bounds it.
    Upstream(UpstreamBody, Bounds),
    Local(Bytes),
}

/// CORS preflights and redirects, which the proxy answers without a backend. A preflight comes
/// first: a browser neither follows a redirect answering one nor a cross-origin redirect
/// without the CORS headers, which the redirect carries.
fn answer_locally(
    filters: &Filters,
    parts: &http::request::Parts,
    host: &str,
    conn: ConnInfo,
    matched_prefix: Option<&str>,
    cors: &CorsAnswer<'_>,
) -> Option<Response<Reply>> {
    if let Some(filter) = &filters.cors {
        if Cors::is_preflight(&parts.method, &parts.headers) {
            let mut response = Response::new(Reply::Local(Bytes::new()));
            *response.status_mut() = StatusCode::NO_CONTENT;
            *response.headers_mut() = filter.preflight(&parts.headers);
            return Some(response);
        }
    }
    if let Some(redirect) = &filters.redirect {
        // Gateway API: a redirect without a scheme keeps the request's. That is the settled
        // one (`settle_forwarded_proto`), not the URI's: the tunnel's requests all name
        // `https` whatever the client used, and an absolute-form request on the plain listener
        // names what its client wrote, not what the connection is.
        let scheme = conn.scheme;
        let mut response = Response::new(Reply::Local(Bytes::new()));
        match redirect.location(
            scheme,
            host,
            parts.uri.path(),
            parts.uri.query(),
            matched_prefix,
        ) {
            Ok(location) => {
                *response.status_mut() = redirect.status;
                response.headers_mut().insert(header::LOCATION, location);
            }
            Err(_) => *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
        }
        filters.apply_response(response.headers_mut());
        cors.decorate(response.headers_mut());
        return Some(response);
    }
    None
}

/// The bytes a `Host` header may hold: a name, an IPv4 or bracketed IPv6 address (with its
/// zone), and a port (RFC 3986 §3.2.2), as Go's server allows them.
const HOST_BYTE: [bool; 256] = cftunnel_config::bytes::alphanumeric_and(b"!$%&'()*+,-.:;=[]_~");

/// The request's host for routing: `Host` (or `:authority`), port removed, lower-cased.
pub(crate) fn request_host(parts: &http::request::Parts) -> Cow<'_, str> {
    let raw = parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    // Byte searches: all delimiters are ASCII, so every cut is on a char boundary. A host with
    // userinfo never gets here (the handler answers it 400).
    let bytes = raw.as_bytes();
    let end = if bytes.first() == Some(&b'[') {
        bytes
            .iter()
            .position(|&b| b == b']')
            .map_or(raw.len(), |i| i + 1)
    } else {
        bytes.iter().position(|&b| b == b':').unwrap_or(raw.len())
    };
    let host = &raw[..end];
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// A gRPC call's deadline, from its `grpc-timeout` header (`<up to 8 digits><unit>`, the
/// unit one of `H`, `M`, `S`, `m`, `u`, `n`); `None` when it sets none or one unreadable.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n.saturating_mul(3600)),
        b'M' => Duration::from_secs(n.saturating_mul(60)),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}
