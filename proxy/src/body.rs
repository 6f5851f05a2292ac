//! Body types at the proxy's seams: one boxed request body type for every source (hyper
//! server, tunnel streams, buffered replays) and a response body that reports completion.

use crate::completion::Completion;
use crate::forward::UpstreamBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body sent upstream.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        // `deadline`: the rule's request or backend timeout, which bound the response body too.
        Upstream { #[pin] body: UpstreamBody, deadline: Option<Pin<Box<tokio::time::Sleep>>> },
        Local { #[pin] body: Full<Bytes> },
    }
}

pin_project_lite::pin_project! {
    /// The body of every response the proxy writes. Counts bytes and, when the body ends or
    /// is dropped, records the request's metrics and access-log line.
    pub struct ResponseBody {
        #[pin]
        inner: Inner,
        completion: Option<Completion>,
    }

    impl PinnedDrop for ResponseBody {
        fn drop(this: Pin<&mut Self>) {
            // Servers stop polling once `is_end_stream()` holds, so a body that ended without a
            // final poll is complete, not aborted.
            let this = this.project();
            if let Some(c) = this.completion.take() {
                let ended = match this.inner.project() {
                    InnerProj::Upstream { body, .. } => body.is_end_stream(),
                    InnerProj::Local { body } => body.is_end_stream(),
                };
                if ended {
                    c.finish();
                } else {
                    c.abort();
                }
            }
        }
    }
}

impl ResponseBody {
    /// A backend's body; with a `deadline` (the rule's request timeout, which covers the whole
    /// exchange, or its backend timeout, which covers the answering try up to its last byte) a
    /// body still streaming then fails, and the client sees it cut off.
    pub(crate) fn upstream(
        body: UpstreamBody,
        completion: Completion,
        deadline: Option<tokio::time::Instant>,
    ) -> Self {
        Self {
            inner: Inner::Upstream {
                body,
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            },
            completion: Some(completion),
        }
    }

    pub(crate) fn local(bytes: Bytes, completion: Option<Completion>) -> Self {
        Self {
            inner: Inner::Local {
                body: Full::new(bytes),
            },
            completion,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = match this.inner.project() {
            InnerProj::Upstream { body, deadline } => {
                // Looked at before the body: one that always has data ready (a fast backend,
                // a large download) would otherwise never be cut.
                let expired = deadline
                    .as_mut()
                    .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
                if expired {
                    if let Some(c) = this.completion.as_ref() {
                        c.backend_timed_out();
                    }
                    Some(Err(BoxError::from("timeout reached mid-response")))
                } else {
                    ready!(body.poll_frame(cx)).map(|r| r.map_err(BoxError::from))
                }
            }
            InnerProj::Local { body } => {
                ready!(body.poll_frame(cx)).map(|r| r.map_err(|never| match never {}))
            }
        };
        match &polled {
            Some(Ok(frame)) => {
                if let (Some(data), Some(c)) = (frame.data_ref(), this.completion.as_mut()) {
                    c.add_bytes(data.len());
                }
            }
            Some(Err(_)) => {
                if let Some(c) = this.completion.take() {
                    c.abort();
                }
            }
            None => {
                if let Some(c) = this.completion.take() {
                    c.finish();
                }
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream { body, .. } => body.is_end_stream(),
            Inner::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream { body, .. } => body.size_hint(),
            Inner::Local { body } => body.size_hint(),
        }
    }
}

pin_project_lite::pin_project! {
    /// Counts request bytes as they stream through.
    pub struct Counted<B> {
        #[pin]
        inner: B,
        counter: prometheus_client::metrics::counter::Counter,
    }
}

impl<B> Counted<B> {
    pub fn new(inner: B, counter: prometheus_client::metrics::counter::Counter) -> Self {
        Self { inner, counter }
    }
}

impl<B: Body<Data = Bytes>> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &polled {
            if let Some(data) = frame.data_ref() {
                this.counter.inc_by(data.len() as u64);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// Carries a sender that closes when the body is dropped, which clients do once the body
    /// has been sent; the forwarder starts its response-head timeout then.
    pub struct Notify<B> {
        #[pin]
        inner: B,
        _sent: tokio::sync::oneshot::Sender<()>,
    }
}

impl<B> Notify<B> {
    pub fn new(inner: B, sent: tokio::sync::oneshot::Sender<()>) -> Self {
        Self { inner, _sent: sent }
    }
}

impl<B: Body<Data = Bytes>> Body for Notify<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// Frames already read from a body, then the rest of it.
    pub struct Prefixed<B> {
        prefix: std::collections::VecDeque<Frame<Bytes>>,
        #[pin]
        inner: B,
    }
}

impl<B> Prefixed<B> {
    pub fn new(prefix: std::collections::VecDeque<Frame<Bytes>>, inner: B) -> Self {
        Self { prefix, inner }
    }
}

impl<B: Body<Data = Bytes>> Body for Prefixed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(frame) = this.prefix.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.inner.is_end_stream()
    }
}
