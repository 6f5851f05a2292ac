//! The controller's Kubernetes API client: kube's own stack, as `kube::Client::try_default`
//! builds it, plus one layer that bounds how long each request waits for its whole response,
//! or, for a watch, for its response head, so a call on an API server connection that went
//! silent fails instead of stalling a round while the Lease is still renewed.
//! See docs/design/api-calls-and-timeouts.md.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tokio::time::Sleep;
use tower::{BoxError, Layer, Service};

/// The bound on a request's time to its whole response when none is configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for the cluster `kube::Client::try_default` would reach (the current kubeconfig,
/// else the pod's service account), each of whose requests fails after `request_timeout`
/// without its whole response (a watch: without its response head).
///
/// # Errors
/// No kubeconfig and no in-cluster service account, or one kube cannot build a client from.
pub async fn connect(request_timeout: Duration) -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    from_config(config, request_timeout)
}

/// A client for `config` with kube's default stack (as `kube::Client::try_from` builds it)
/// and, outermost, [`RequestTimeoutLayer`] with `request_timeout`.
///
/// # Errors
/// What `kube::client::ClientBuilder::try_from` refuses: an unreadable certificate or key,
/// an auth method or proxy this build of kube does not support.
pub fn from_config(config: Config, request_timeout: Duration) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&RequestTimeoutLayer::new(request_timeout))
        .build())
}

/// A request that had not received what the bound covers (see [`Awaited`]) within it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{method} {path}: no {awaited} from the API server within {bound:?}")]
pub struct RequestTimeoutError {
    pub method: Method,
    /// The request's path, without its query.
    pub path: String,
    /// The whole response, or, for a watch, its head.
    pub awaited: Awaited,
    pub bound: Duration,
}

/// What of its response a request must have received within the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// Head and body: any request but a watch.
    WholeResponse,
    /// The head only: a watch, whose body stays open as long as the API server keeps it.
    Head,
}

impl std::fmt::Display for Awaited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::WholeResponse => "complete response",
            Self::Head => "response head",
        })
    }
}

/// Bounds each request's time to its whole response, a watch's to its response head; see
/// [`RequestTimeout`].
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeoutLayer {
    bound: Duration,
}

impl RequestTimeoutLayer {
    /// Requests get `bound` for their whole response, watches for their response head.
    pub fn new(bound: Duration) -> Self {
        Self { bound }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout {
            inner,
            bound: self.bound,
        }
    }
}

/// Fails a request with [`RequestTimeoutError`] when its response head, or the end of its
/// body, has not arrived `bound` after the request was handed to this layer; a body still
/// streaming then yields that error as its next frame. For a watch (see [`is_watch`]) only the
/// head is bounded; its body streams on unbounded.
///
/// The clock starts in `call`, before kube's inner layers (token refresh, connecting, TLS);
/// time queued in kube's `tower::Buffer` is not counted. The inner service's futures and
/// bodies must be `Unpin`, as those of kube's boxed stack are.
#[derive(Debug, Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    bound: Duration,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RequestTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Unpin,
    ResBody: Body + Unpin,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let awaited = if is_watch(req.uri()) {
            Awaited::Head
        } else {
            Awaited::WholeResponse
        };
        let deadline = Deadline {
            sleep: Box::pin(tokio::time::sleep(self.bound)),
            method: req.method().clone(),
            uri: req.uri().clone(),
            awaited,
            bound: self.bound,
        };
        ResponseFuture {
            inner: self.inner.call(req),
            deadline: Some(deadline),
        }
    }
}

/// Whether a request is a watch, which stays open, quiet for minutes at a time, by design:
/// its `watch` query parameter (the first, as the API server reads it) is present and neither
/// `0` nor `false` in any case (apimachinery's `Convert_Slice_string_To_bool`). kube-runtime's
/// watcher sends `watch=true`, streaming lists (`sendInitialEvents`) included.
pub fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some(("watch", value)) => Some(value),
            None if pair == "watch" => Some(""),
            _ => None,
        })
        .is_some_and(|value| !(value == "0" || value.eq_ignore_ascii_case("false")))
}

/// When a request runs out of time, and what it was.
struct Deadline {
    sleep: Pin<Box<Sleep>>,
    method: Method,
    uri: Uri,
    awaited: Awaited,
    bound: Duration,
}

impl Deadline {
    /// The error, once the deadline has passed.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Option<RequestTimeoutError> {
        self.sleep
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(|| RequestTimeoutError {
                method: self.method.clone(),
                path: self.uri.path().to_owned(),
                awaited: self.awaited,
                bound: self.bound,
            })
    }
}

/// The response future of [`RequestTimeout`].
pub struct ResponseFuture<F> {
    inner: F,
    /// `None` once the response head has arrived.
    deadline: Option<Deadline>,
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>> + Unpin,
    E: Into<BoxError>,
{
    type Output = Result<Response<BoundedBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // A response that is ready wins over a deadline that passed meanwhile.
        if let Poll::Ready(result) = Pin::new(&mut this.inner).poll(cx) {
            // A watch's body is not bounded: it stays quiet while nothing changes.
            let deadline = this
                .deadline
                .take()
                .filter(|d| d.awaited == Awaited::WholeResponse);
            return Poll::Ready(
                result
                    .map(|res| res.map(|inner| BoundedBody { inner, deadline }))
                    .map_err(Into::into),
            );
        }
        match this.deadline.as_mut().and_then(|d| d.poll_expired(cx)) {
            // Dropping the inner future drops its connection: it is not reused.
            Some(expired) => Poll::Ready(Err(expired.into())),
            None => Poll::Pending,
        }
    }
}

/// A response body that fails with [`RequestTimeoutError`] if it has not ended by its
/// request's deadline.
pub struct BoundedBody<B> {
    inner: B,
    /// `None` for a watch, and once the body has ended.
    deadline: Option<Deadline>,
}

impl<B> Body for BoundedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_none() {
                this.deadline = None;
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match this.deadline.as_mut().and_then(|d| d.poll_expired(cx)) {
            Some(expired) => Poll::Ready(Some(Err(expired.into()))),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_by_their_watch_parameter_as_the_api_server_reads_it() {
        let cases = [
            ("/api/v1/namespaces", false),
            ("/api/v1/namespaces?limit=500", false),
            (
                "/api/v1/namespaces?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=0",
                true,
            ),
            ("/api/v1/namespaces?watch=1", true),
            ("/api/v1/namespaces?watch=True", true),
            ("/api/v1/namespaces?watch", true),
            ("/api/v1/namespaces?watch=", true),
            ("/api/v1/namespaces?watch=false", false),
            ("/api/v1/namespaces?watch=FALSE", false),
            ("/api/v1/namespaces?watch=0", false),
            ("/api/v1/namespaces?watch=0&watch=true", false),
            ("/api/v1/namespaces?watchx=true", false),
            ("/api/v1/namespaces?labelSelector=watch%3Dtrue", false),
        ];
        for (uri, watch) in cases {
            let uri: Uri = uri.parse().expect("a URI");
            assert_eq!(is_watch(&uri), watch, "{uri}");
        }
    }
}
