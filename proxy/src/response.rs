//! The body of every response the proxy writes: a backend's, bounded by the rule's
//! deadlines, or one the proxy answers itself. It counts the bytes the client is sent and
//! completes the request's accounting (`Completion`) when it ends or is dropped, which is
//! the only moment a streamed response is known to be over.

use crate::body::BoxError;
use crate::completion::Completion;
use crate::forward::UpstreamBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        // `deadline`: the rule's request or backend timeout, which bound the response body too.
        // `trailers_at_deadline`: a gRPC call's client reads its status from trailers, and is
        // told the deadline passed (DEADLINE_EXCEEDED) rather than seeing its stream reset.
        // `stall`: how long the body may send nothing, and when that runs out.
        Upstream {
            #[pin] body: UpstreamBody,
            deadline: Option<Pin<Box<tokio::time::Sleep>>>,
            stall: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
            trailers_at_deadline: bool,
            ended: bool,
        },
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
                    InnerProj::Upstream { body, ended, .. } => *ended || body.is_end_stream(),
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

/// What bounds a backend's response body (none: it may take as long as it likes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The instant it must have ended by: the rule's request timeout, or the answering try's
    /// backend timeout, whichever ends first.
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// How long it may send nothing, from its head or its last frame.
    pub(crate) stall: Option<Duration>,
}

impl ResponseBody {
    /// A backend's body; with a deadline (the rule's request timeout, which covers the whole
    /// exchange, or its backend timeout, which covers the answering try up to its last byte) a
    /// body still streaming then fails, and the client sees it cut off. With
    /// `trailers_at_deadline` (a gRPC call whose client reads trailers) it ends instead, with
    /// trailers saying `grpc-status: 4`. A body that sends nothing for its stall bound fails
    /// the same way; both count as the backend's timeout.
    pub(crate) fn upstream(
        body: UpstreamBody,
        completion: Completion,
        bounds: Bounds,
        trailers_at_deadline: bool,
    ) -> Self {
        Self {
            inner: Inner::Upstream {
                body,
                deadline: bounds
                    .deadline
                    .map(|at| Box::pin(tokio::time::sleep_until(at))),
                stall: bounds
                    .stall
                    .map(|limit| (limit, Box::pin(tokio::time::sleep(limit)))),
                trailers_at_deadline,
                ended: false,
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
            InnerProj::Upstream {
                body,
                deadline,
                stall,
                trailers_at_deadline,
                ended,
            } => {
                if *ended {
                    return Poll::Ready(None);
                }
                // Looked at before the body: one that always has data ready (a fast backend,
                // a large download) would otherwise never be cut.
                let expired = deadline
                    .as_mut()
                    .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
                if expired {
                    if let Some(c) = this.completion.as_ref() {
                        c.backend_timed_out();
                    }
                    if *trailers_at_deadline {
                        *ended = true;
                        *deadline = None;
                        if let Some(c) = this.completion.take() {
                            c.abort();
                        }
                        return Poll::Ready(Some(Ok(Frame::trailers(deadline_trailers()))));
                    }
                    Some(Err(BoxError::from("timeout reached mid-response")))
                } else {
                    match body.poll_frame(cx) {
                        Poll::Ready(frame) => {
                            if let Some((limit, timer)) = stall {
                                timer.as_mut().reset(tokio::time::Instant::now() + *limit);
                            }
                            frame.map(|r| r.map_err(BoxError::from))
                        }
                        Poll::Pending => {
                            let Some((_, timer)) = stall else {
                                return Poll::Pending;
                            };
                            ready!(timer.as_mut().poll(cx));
                            if let Some(c) = this.completion.as_ref() {
                                c.backend_timed_out();
                            }
                            Some(Err(BoxError::from("backend sent nothing mid-response")))
                        }
                    }
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
            Inner::Upstream { body, ended, .. } => *ended || body.is_end_stream(),
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

/// The trailers that end a gRPC response cut at its deadline.
fn deadline_trailers() -> http::HeaderMap {
    let mut trailers = http::HeaderMap::with_capacity(2);
    trailers.insert("grpc-status", http::HeaderValue::from_static("4"));
    trailers.insert(
        "grpc-message",
        http::HeaderValue::from_static("timeout reached mid-response"),
    );
    trailers
}
