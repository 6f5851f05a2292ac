//! Retries: a request's tries against its backends until one answers, as the rule's retry
//! policy and timeouts say.
//!
//! Only a buffered body (see `Payload`) is sent more than once; a streamed one gets one try.
//! Every try has its own timeout; a retry may go to another endpoint of the same rule when
//! that changes nothing else about the request.

use super::error::ForwardError;
use super::payload::Payload;
use super::request::{upstream_request, UnforwardableTarget};
use super::{TryBody, TryBounds, Upstream, UpstreamBody};
use crate::body;
use crate::metrics::HostMetrics;
use crate::trace::{RequestTrace, TrySpan};
use http::Response;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// When a failed try is tried again, how often, and how long after.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Response statuses that trigger another try; connection errors always do.
    pub codes: Box<[u16]>,
    /// Tries after the first.
    pub attempts: u32,
    pub backoff: Duration,
}

/// A response head, and the instant the answering try's timeout ends if the rule set one.
pub(crate) type Answer = (Response<UpstreamBody>, Option<Instant>);

/// What bounds each try.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TryTimeout {
    /// The rule's backend timeout, which bounds each try up to the end of its response body.
    pub(crate) backend: Option<Duration>,
    /// For rules without one, the bound on the response head alone; `None`: none.
    pub(crate) header: Option<Duration>,
    /// The same for a gRPC call that goes over HTTP/2.
    pub(crate) grpc_header: Option<Duration>,
}

impl TryTimeout {
    /// The bounds of a try of `rule`, the proxy's default wait for a response head being
    /// `header`. That default never cuts a request shorter than the rule allows: it is
    /// stretched to the rule's request timeout, and off where a rule's timeout is `0s`
    /// (Gateway API: the timeout is disabled). A gRPC call (`grpc`, with its deadline) may
    /// get its response head only with a first message that can be long in coming (a watch):
    /// over HTTP/2 the call's own deadline (`grpc-timeout`) bounds the wait instead, and
    /// without one the client waits as long as it chose to. Over HTTP/1.1 the default holds:
    /// the client's word alone lifts no bound there.
    pub(crate) fn of(
        rule: &crate::rule::Rule,
        header: Duration,
        grpc: Option<Option<Duration>>,
    ) -> Self {
        let header = match rule.request_timeout {
            _ if rule.timeouts_off => None,
            Some(request) => Some(header.max(request)),
            None => Some(header),
        };
        let grpc_header = match grpc {
            _ if rule.timeouts_off => None,
            Some(deadline) => deadline,
            None => header,
        };
        Self {
            backend: rule.backend_timeout,
            header,
            grpc_header,
        }
    }

    /// What bounds a try: the rule's backend timeout, or the wait for the head.
    fn per_try(self) -> TryBounds {
        TryBounds {
            http1: self.backend.or(self.header),
            http2: self.backend.or(self.grpc_header),
        }
    }
}

/// Why an exchange ended without a response head.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The last try failed.
    #[error(transparent)]
    Backend(#[from] ForwardError),
    #[error(transparent)]
    Target(#[from] UnforwardableTarget),
}

/// What the tries of an exchange were: how many were sent, and where the last went.
#[derive(Debug, Default)]
pub(crate) struct Tries<'a> {
    pub(crate) count: u32,
    pub(crate) last: Option<&'a Upstream>,
}

/// Tries `upstream` (and retries as `retry` says) until a response head arrives.
///
/// With the head comes, when the rule sets a backend timeout, the instant the answering
/// try's timeout ends: Gateway API's `backendRequest` covers the exchange "to when the full
/// response has been received", so that try's response body must end by then too. The
/// proxy's default header timeout bounds the head only, so streams and long downloads of
/// rules without one keep working.
///
/// `another` offers, for each retry, another endpoint to send it to (`None`: the same one).
/// `tries` counts the tries as they are sent, whatever the outcome. With `trace`, every try
/// gets a client span and carries its `traceparent`; the answering try's span is handed to
/// the trace, to end with the response.
///
/// The request of a single try is built before the returned future first runs, so that
/// future holds the try and nothing else; it is moved whole wherever the request's future
/// goes. Retries, which hold the request's parts for the next try, are boxed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exchange<'a: 'f, 'f, A>(
    upstream: &'a Upstream,
    parts: http::request::Parts,
    body: Payload,
    timeout: TryTimeout,
    retry: Option<&'f RetryPolicy>,
    another: A,
    host_metrics: &'f HostMetrics,
    tries: &'f mut Tries<'a>,
    trace: Option<&'f mut RequestTrace>,
) -> Exchange<'f, impl Future<Output = Result<Answer, ForwardError>> + Send + use<'a, A>>
where
    A: FnMut() -> Option<&'a Upstream> + Send + 'f,
{
    match (retry, &body) {
        (Some(policy), Payload::Replayable(_)) => Exchange::Retrying {
            tries: Box::pin(with_retries(
                upstream,
                parts,
                body,
                timeout,
                policy,
                another,
                host_metrics,
                tries,
                trace,
            )),
        },
        _ => match last_try(upstream, parts, body, timeout, tries, trace) {
            Ok(once) => Exchange::Once { once },
            Err(e) => Exchange::Refused {
                error: Some(e.into()),
            },
        },
    }
}

pin_project_lite::pin_project! {
    /// What [`exchange`] returns: one try, tries with retries, or a request that could not
    /// be built.
    #[project = ExchangeProj]
    pub(crate) enum Exchange<'a, F> {
        Once { #[pin] once: Answering<'a, F> },
        Retrying { tries: Pin<Box<dyn Future<Output = Result<Answer, ExchangeError>> + Send + 'a>> },
        Refused { error: Option<ExchangeError> },
    }
}

impl<F: Future<Output = Result<Answer, ForwardError>>> Future for Exchange<'_, F> {
    type Output = Result<Answer, ExchangeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ExchangeProj::Once { once } => once.poll(cx),
            ExchangeProj::Retrying { tries } => tries.as_mut().poll(cx),
            ExchangeProj::Refused { error } => match error.take() {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

/// The tries of a request with a retry policy and a buffered body: each but the last sends
/// a copy of the body and headers.
#[allow(clippy::too_many_arguments)]
async fn with_retries<'a: 'f, 'f>(
    upstream: &'a Upstream,
    parts: http::request::Parts,
    body: Payload,
    timeout: TryTimeout,
    policy: &RetryPolicy,
    mut another: impl FnMut() -> Option<&'a Upstream>,
    host_metrics: &HostMetrics,
    tries: &'f mut Tries<'a>,
    mut trace: Option<&'f mut RequestTrace>,
) -> Result<Answer, ExchangeError> {
    let per_try = timeout.per_try();
    let explicit = timeout.backend.is_some();
    let mut target = upstream;
    upstream.retry_budget.deposit();
    if let Payload::Replayable(bytes) = &body {
        for _ in 0..policy.attempts {
            let mut req = upstream_request(
                &parts,
                parts.headers.clone(),
                target,
                body::full(bytes.clone()),
            )?;
            let span = trace
                .as_deref()
                .map(|t| t.start_try(&mut req, target, tries.count));
            tries.count += 1;
            tries.last = Some(target);
            let result = target
                .send(req, per_try, TryBody::Held(bytes.clone()))
                .await;
            let retryable = match &result {
                Ok((resp, _)) => policy.codes.contains(&resp.status().as_u16()),
                Err(e) => e.is_retryable(),
            };
            if !retryable {
                return answered(result, explicit, span, trace.as_deref_mut());
            }
            // A retry the budget does not cover makes this try the answering one.
            if !upstream.retry_budget.withdraw() {
                host_metrics.retries_over_budget.inc();
                return answered(result, explicit, span, trace.as_deref_mut());
            }
            // A failed try that is retried is counted here; the final one where it is answered.
            match &result {
                Err(e) => {
                    host_metrics.backend_error(e.label()).inc();
                    if let Some(span) = span {
                        span.failed(e.label());
                    }
                }
                Ok((resp, _)) => {
                    if let Some(mut span) = span {
                        span.answered(resp.status().as_u16());
                        span.end();
                    }
                }
            }
            if !policy.backoff.is_zero() {
                tokio::time::sleep(policy.backoff).await;
            }
            if let Some(next) = another() {
                target = next;
            }
        }
    }
    last_try(target, parts, body, timeout, tries, trace)?.await
}

/// The last try, or the only one: it takes the body and the headers.
fn last_try<'a: 'f, 'f>(
    target: &'a Upstream,
    mut parts: http::request::Parts,
    body: Payload,
    timeout: TryTimeout,
    tries: &mut Tries<'a>,
    trace: Option<&'f mut RequestTrace>,
) -> Result<
    Answering<'f, impl Future<Output = Result<Answer, ForwardError>> + Send + 'a>,
    UnforwardableTarget,
> {
    let per_try = timeout.per_try();
    let (body, body_sent) = body.into_body();
    let headers = std::mem::take(&mut parts.headers);
    let mut req = upstream_request(&parts, headers, target, body)?;
    let span = trace
        .as_deref()
        .map(|t| t.start_try(&mut req, target, tries.count));
    tries.count += 1;
    tries.last = Some(target);
    Ok(Answering {
        send: target.send(req, per_try, body_sent),
        explicit: timeout.backend.is_some(),
        span,
        trace,
    })
}

pin_project_lite::pin_project! {
    /// A try that may be the answering one: its outcome goes through [`answered`].
    pub(crate) struct Answering<'a, F> {
        #[pin]
        send: F,
        explicit: bool,
        span: Option<TrySpan>,
        trace: Option<&'a mut RequestTrace>,
    }
}

impl<F: Future<Output = Result<Answer, ForwardError>>> Future for Answering<'_, F> {
    type Output = Result<Answer, ExchangeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.send.poll(cx));
        Poll::Ready(answered(
            result,
            *this.explicit,
            this.span.take(),
            this.trace.as_deref_mut(),
        ))
    }
}

/// The answering try's outcome. The instant its timeout ends stands only for a timeout the
/// rule set (`explicit`): the proxy's default bounds the response head alone.
/// The answering try's span goes to the trace, to end with the response; a failed one ends
/// here.
fn answered(
    result: Result<Answer, ForwardError>,
    explicit: bool,
    span: Option<TrySpan>,
    trace: Option<&mut RequestTrace>,
) -> Result<Answer, ExchangeError> {
    match result {
        Ok((resp, try_end)) => {
            if let (Some(mut span), Some(trace)) = (span, trace) {
                span.answered(resp.status().as_u16());
                trace.answered_by(span);
            }
            Ok((resp, try_end.filter(|_| explicit)))
        }
        Err(e) => {
            if let Some(span) = span {
                span.failed(e.label());
            }
            Err(e.into())
        }
    }
}
