//! Request body types at the proxy's seams: one boxed type for every source (hyper server,
//! tunnel streams, buffered replays) and the wrappers the request path streams it through.
//! They know nothing of routes or backends, so everything else can build on them.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
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
