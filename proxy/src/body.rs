//! Request body types at the proxy's seams: one boxed type for every source (hyper server,
//! tunnel streams, buffered replays) and the wrappers the request path streams it through.
//! They know nothing of routes or backends, so everything else can build on them.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body sent upstream: none at all (every GET, for one) without a box, any
/// other boxed. As small as the box alone, so the request it rides in moves no more bytes
/// on its way through the client's channel.
#[derive(Debug)]
pub struct ProxyBody(Option<UnsyncBoxBody<Bytes, BoxError>>);

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|body| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |body| body.size_hint())
    }
}

pub fn full(bytes: Bytes) -> ProxyBody {
    if bytes.is_empty() {
        return ProxyBody(None);
    }
    boxed(Full::new(bytes))
}

pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    ProxyBody(Some(body.map_err(Into::into).boxed_unsync()))
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

/// What a [`Quiet`]-bounded body and its request share: whether the response head has come
/// (no bound after it) and whether the bound ended the body.
#[derive(Debug, Default)]
pub struct QuietState {
    answered: AtomicBool,
    expired: AtomicBool,
}

impl QuietState {
    /// The response head has come: from now on the body may pause as long as it likes (a
    /// bidirectional stream waits on its peer).
    pub fn answered(&self) {
        self.lift();
    }

    /// From now on the body may pause as long as it likes: its response head has come, or it
    /// is a gRPC call's that went out over HTTP/2 (a stream's messages come when its peer has
    /// something to say).
    pub fn lift(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Whether the body was ended for sending nothing for too long.
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::Relaxed)
    }
}

/// A request body sent nothing for the proxy's body timeout before any response came.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?}")]
pub struct BodyIdle(Duration);

pin_project_lite::pin_project! {
    /// Ends a request body with [`BodyIdle`] once it has sent nothing for `timeout` while no
    /// response head has come: a client that stops mid-upload, or vanishes without a word,
    /// would otherwise hold its connection, a backend connection and the backend's handler
    /// for good. Without a state (a body that had ended before it started), a pass-through.
    /// The timer is armed only when the body first makes the request wait.
    pub struct Quiet<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
        state: Option<Arc<QuietState>>,
    }
}

impl<B> Quiet<B> {
    pub fn new(inner: B, timeout: Duration, state: Option<Arc<QuietState>>) -> Self {
        Self {
            inner,
            timeout,
            timer: None,
            state,
        }
    }
}

impl<B> Body for Quiet<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Poll::Ready(polled) = this.inner.poll_frame(cx) {
            if let Some(timer) = this.timer {
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + *this.timeout);
            }
            return Poll::Ready(polled.map(|r| r.map_err(Into::into)));
        }
        let Some(state) = this.state else {
            return Poll::Pending;
        };
        if state.answered.load(Ordering::Relaxed) {
            *this.timer = None;
            return Poll::Pending;
        }
        let timeout = *this.timeout;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(timer.as_mut().poll(cx));
        // Checked again: the head may have come while the timer ran.
        if state.answered.load(Ordering::Relaxed) {
            *this.timer = None;
            return Poll::Pending;
        }
        state.expired.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(Box::new(BodyIdle(timeout)))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a streamed request body is on its way to the backend: closes once the body has been
/// sent, which is when the try's response-head timeout starts; until then, tells a backend
/// that stopped taking the body from a client that is slow to send it.
#[derive(Debug)]
pub struct Sent {
    closed: tokio::sync::oneshot::Receiver<()>,
    handed: Arc<Handed>,
}

impl Sent {
    /// Resolves once the body has been sent (or dropped); or with `Err` once the body has had a
    /// frame taken from it and then not been asked for the next one for `limit()`: the
    /// backend's connection takes nothing more. A body waiting on its client is not stalled,
    /// however long (its own bound is [`Quiet`]'s). `limit` is asked again as time passes,
    /// since it may depend on the protocol the try goes over; `None`: no bound for now.
    ///
    /// Also `Err` at `unasked_until()` if nothing has asked the body for a frame by then: the
    /// try is still dialing, handshaking or waiting for its connection, which the try's bound
    /// counts from its start, as for a body held whole. Asked again as time passes, as `limit`.
    pub async fn closed_within(
        &mut self,
        limit: impl Fn() -> Option<Duration>,
        unasked_until: impl Fn() -> Option<tokio::time::Instant>,
    ) -> Result<(), BodyStalled> {
        /// How soon a try without a bound for now looks again.
        const UNBOUNDED_LOOK: Duration = Duration::from_secs(1);
        let handed = &self.handed;
        let stalled = async {
            loop {
                let unasked = unasked_until().filter(|_| !handed.asked());
                let now = tokio::time::Instant::now();
                if unasked.is_some_and(|until| until <= now) {
                    return;
                }
                let wait = match (limit(), handed.waiting()) {
                    (None, _) => UNBOUNDED_LOOK,
                    (Some(limit), Some(waited)) if waited >= limit => return,
                    (Some(limit), Some(waited)) => limit - waited,
                    (Some(limit), None) => limit,
                };
                let wait = unasked.map_or(wait, |until| wait.min(until - now));
                tokio::time::sleep(wait).await;
            }
        };
        tokio::select! {
            _ = &mut self.closed => Ok(()),
            () = stalled => Err(BodyStalled),
        }
    }
}

/// A streamed request body the backend's connection stopped taking.
#[derive(Debug)]
pub struct BodyStalled;

/// When a streamed body last handed a frame that nothing has asked it to follow yet.
#[derive(Debug)]
struct Handed {
    origin: tokio::time::Instant,
    /// Milliseconds from `origin` to that frame, plus one; 0 while the body's last poll
    /// waited on its client, or it has ended; [`NEVER_ASKED`] until it is first polled.
    at: AtomicU64,
}

/// [`Handed::at`] before anything has asked the body for a frame.
const NEVER_ASKED: u64 = u64::MAX;

impl Handed {
    fn mark(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.at
            .store(ms.saturating_add(1).min(NEVER_ASKED - 1), Ordering::Relaxed);
    }

    /// Whether anything has asked the body for a frame yet.
    fn asked(&self) -> bool {
        self.at.load(Ordering::Relaxed) != NEVER_ASKED
    }

    fn waiting(&self) -> Option<Duration> {
        let at = self.at.load(Ordering::Relaxed);
        let at = at.checked_sub(1).filter(|_| at != NEVER_ASKED)?;
        Some(
            self.origin
                .elapsed()
                .saturating_sub(Duration::from_millis(at)),
        )
    }
}

pin_project_lite::pin_project! {
    /// A streamed request body as the backend's connection takes it: it closes [`Sent`] when
    /// dropped, which clients do once the body has been sent, and notes each frame handed.
    pub struct Notify<B> {
        #[pin]
        inner: B,
        _sent: tokio::sync::oneshot::Sender<()>,
        handed: Arc<Handed>,
    }
}

impl<B> Notify<B> {
    pub fn new(inner: B) -> (Self, Sent) {
        let (sent, closed) = tokio::sync::oneshot::channel();
        let handed = Arc::new(Handed {
            origin: tokio::time::Instant::now(),
            at: AtomicU64::new(NEVER_ASKED),
        });
        let body = Self {
            inner,
            _sent: sent,
            handed: Arc::clone(&handed),
        };
        (body, Sent { closed, handed })
    }
}

impl<B: Body<Data = Bytes>> Body for Notify<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => this.handed.mark(),
            _ => this.handed.at.store(0, Ordering::Relaxed),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// What was already read from a body (its data in one piece, then at most one frame that
    /// came after it), then the rest of it.
    pub struct Prefixed<B> {
        data: Option<Bytes>,
        next: Option<Frame<Bytes>>,
        #[pin]
        inner: B,
    }
}

impl<B> Prefixed<B> {
    /// `data` (skipped when empty), then `next`, then what is left of `inner`.
    pub fn new(data: Bytes, next: Option<Frame<Bytes>>, inner: B) -> Self {
        Self {
            data: (!data.is_empty()).then_some(data),
            next,
            inner,
        }
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
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(frame) = this.next.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.next.is_none() && self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_body_is_one_frame_and_an_empty_one_has_ended_before_any() {
        let empty = full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        let collected = empty.collect().await.expect("an empty body cannot fail");
        assert!(collected.to_bytes().is_empty());

        let body = full(Bytes::from_static(b"hello"));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(5));
        let collected = body.collect().await.expect("a full body cannot fail");
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"hello"));
    }
}
