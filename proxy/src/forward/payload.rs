//! The request body as the forwarder needs it: buffered, up to a cap, when a retry or a
//! mirror may send it again, and streamed otherwise.
//!
//! Buffering is bounded ([`MAX_REPLAY_BODY`]) and happens only for rules that retry or
//! mirror; every other body streams straight through to the backend, with a signal when it
//! has been sent so the try's timeout can start then.

use super::TryBody;
use crate::body::{self, BoxError, ProxyBody, QuietState};
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Request bodies up to this size are buffered when a retry or a mirror needs to replay them.
pub const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// How long a body of unknown length may pause, while it is read for a replay, before it is
/// streamed on instead: a streaming client (a bidirectional gRPC call, a chunked upload that
/// waits for the answer) sends part of its body and waits for the backend, which would
/// otherwise never see the request. Such a request is then sent once, not mirrored.
pub const REPLAY_LULL: std::time::Duration = std::time::Duration::from_millis(50);

/// The client's request body failed while it was being read for a replay.
#[derive(Debug, thiserror::Error)]
#[error("request body could not be read")]
pub struct UnreadableBody;

/// The request body as the exchange needs it.
pub(crate) enum Payload {
    /// Buffered (or empty): can be sent more than once.
    Replayable(Bytes),
    /// Streamed: one try only. The receiver closes once the body has been sent; the state,
    /// for a gRPC call, is the body's stall bound, lifted if the try goes over HTTP/2.
    Stream(ProxyBody, oneshot::Receiver<()>, Option<Arc<QuietState>>),
}

impl Payload {
    /// Reads as much of `body` as it must: all of it, up to [`MAX_REPLAY_BODY`], when a retry
    /// or a mirror may send it again (`replay_needed`), none of it otherwise. A body longer
    /// than the cap streams on, with what was read first, and is sent once.
    pub(crate) async fn read<B>(body: B, replay_needed: bool) -> Result<Self, UnreadableBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if body.is_end_stream() {
            return Ok(Self::Replayable(Bytes::new()));
        }
        let too_big = body.size_hint().upper().is_none_or(|n| n > MAX_REPLAY_BODY);
        if !replay_needed || body.size_hint().lower() > MAX_REPLAY_BODY {
            return Ok(Self::stream(body));
        }
        if !too_big {
            let collected = http_body_util::Limited::new(body, MAX_REPLAY_BODY as usize)
                .collect()
                .await
                .map_err(|_| UnreadableBody)?;
            return Ok(Self::Replayable(collected.to_bytes()));
        }
        // Unknown length (chunked, HTTP/2 without content-length): read up to the cap; a body
        // that ends within it is replayable, a longer one, or one that pauses for
        // [`REPLAY_LULL`], streams on with what was read first.
        let mut body = Box::pin(body);
        let mut prefix: std::collections::VecDeque<Frame<Bytes>> =
            std::collections::VecDeque::new();
        let mut total = 0u64;
        loop {
            let Ok(frame) = tokio::time::timeout(REPLAY_LULL, body.frame()).await else {
                return Ok(Self::stream(body::Prefixed::new(prefix, body)));
            };
            match frame {
                None => {
                    let mut all = bytes::BytesMut::with_capacity(total as usize);
                    for frame in prefix {
                        if let Some(data) = frame.data_ref() {
                            all.extend_from_slice(data);
                        }
                    }
                    return Ok(Self::Replayable(all.freeze()));
                }
                Some(Err(_)) => return Err(UnreadableBody),
                Some(Ok(frame)) => {
                    let trailers = frame.is_trailers();
                    total += frame.data_ref().map_or(0, |d| d.len() as u64);
                    prefix.push_back(frame);
                    if trailers || total > MAX_REPLAY_BODY {
                        return Ok(Self::stream(body::Prefixed::new(prefix, body)));
                    }
                }
            }
        }
    }

    fn stream<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (sent, sent_rx) = oneshot::channel();
        Self::Stream(body::boxed(body::Notify::new(body, sent)), sent_rx, None)
    }

    /// For a gRPC call: `quiet`, the stall bound of a streamed body, is lifted if its try goes
    /// over HTTP/2, and holds over HTTP/1.1.
    pub(crate) fn lifted_over_http2(self, quiet: Option<Arc<QuietState>>) -> Self {
        match self {
            Self::Stream(body, sent, _) => Self::Stream(body, sent, quiet),
            held => held,
        }
    }

    /// The buffered body, which retries and mirrors can send again.
    pub(crate) fn replayable(&self) -> Option<&Bytes> {
        match self {
            Self::Replayable(b) => Some(b),
            Self::Stream(..) => None,
        }
    }

    /// The body for the last (or only) try, and what the try needs to know of it: the bytes
    /// of a buffered one, the receiver that closes once a streamed one has been sent.
    pub(crate) fn into_body(self) -> (ProxyBody, TryBody) {
        match self {
            Self::Replayable(b) => (body::full(b.clone()), TryBody::Held(b)),
            Self::Stream(b, sent, lift) => (b, TryBody::Streamed { sent, lift }),
        }
    }
}

/// An empty request body for mirrors and retries of body-less requests.
pub fn empty_body() -> ProxyBody {
    body::full(Bytes::new())
}
