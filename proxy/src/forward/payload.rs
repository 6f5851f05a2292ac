//! The request body as the forwarder needs it: held, up to a cap, before a backend connection
//! is taken, and streamed otherwise.
//!
//! A body is held whole when its length is known and within [`MAX_REPLAY_BODY`], and, for
//! rules that retry or mirror, also when its length is unknown and it ends within the cap
//! without keeping the proxy waiting long ([`REPLAY_LULL`], [`REPLAY_HOLD`]): a held body can
//! be sent again, and a client that trickles it in holds no backend connection
//! meanwhile, only its own place in flight. What is read is gathered into one buffer as it
//! comes, so a body costs about its bytes however finely it is chunked (see [`Buffer`]). Every
//! other body streams straight through to the backend, with a signal when it has been sent so
//! the try's timeout can start then.

use super::TryBody;
use crate::body::{self, BoxError, ProxyBody, QuietState, Sent};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt as _;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use std::sync::Arc;

/// Request bodies up to this size are held before they are forwarded: every one whose length
/// is known, and one of unknown length when a retry or a mirror needs to replay it.
pub const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// How long a body of unknown length may pause, while it is read for a replay, before it is
/// streamed on instead: a streaming client (a bidirectional gRPC call, a chunked upload that
/// waits for the answer) sends part of its body and waits for the backend, which would
/// otherwise never see the request. Such a request is then sent once, not mirrored.
pub const REPLAY_LULL: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a body of unknown length may keep its read for a replay waiting in all, its pauses
/// added up: a streaming client that never pauses for [`REPLAY_LULL`] (a gRPC call sending a
/// message every 20 ms) would otherwise be held until it had sent the whole cap, its backend
/// seeing nothing meanwhile. A body still open then streams on, sent once. Only waits count:
/// a body that has come whole, however finely chunked and however long it takes to read, is
/// held.
pub const REPLAY_HOLD: std::time::Duration = std::time::Duration::from_millis(100);

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
    Stream(ProxyBody, Sent, Option<Arc<QuietState>>),
}

impl Payload {
    /// Reads as much of `body` as it must before a backend connection is taken: all of it when
    /// its length is known and within [`MAX_REPLAY_BODY`] and `hold_known` (not for a gRPC
    /// call, whose client may wait on the server's messages before it sends more of its
    /// own); otherwise up to the cap when a retry or a mirror may send it again
    /// (`replay_needed`), none when not. A body longer than the cap streams on, with what was
    /// read first, and is sent once.
    pub(crate) async fn read<B>(
        body: B,
        replay_needed: bool,
        hold_known: bool,
    ) -> Result<Self, UnreadableBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if body.is_end_stream() {
            return Ok(Self::Replayable(Bytes::new()));
        }
        let hint = body.size_hint();
        // A stated length the client has committed to sending, so reading it whole waits for
        // nothing the backend would have to say first.
        let known = hint.upper().filter(|&n| n <= MAX_REPLAY_BODY);
        if hint.lower() > MAX_REPLAY_BODY || !(replay_needed || hold_known && known.is_some()) {
            return Ok(Self::stream(body));
        }
        // A known length within the cap is read whole; an unknown one (chunked, HTTP/2
        // without content-length) up to the cap: a body that ends within it is replayable, a
        // longer one, one that pauses for [`REPLAY_LULL`] or whose pauses add up to
        // [`REPLAY_HOLD`], streams on with what was read.
        let mut read = Buffer::new(known);
        let mut body = Box::pin(body);
        let mut may_wait = REPLAY_HOLD;
        loop {
            let frame = match known {
                Some(_) => body.frame().await,
                // A frame already come costs no wait, and no clock read.
                None => match body.frame().now_or_never() {
                    Some(frame) => frame,
                    None => {
                        let since = tokio::time::Instant::now();
                        let wait = REPLAY_LULL.min(may_wait);
                        match tokio::time::timeout(wait, body.frame()).await {
                            Ok(frame) => {
                                may_wait = may_wait.saturating_sub(since.elapsed());
                                frame
                            }
                            Err(_) => {
                                let read = read.into_bytes();
                                return Ok(Self::stream(body::Prefixed::new(read, None, body)));
                            }
                        }
                    }
                },
            };
            let frame = match frame {
                None => return Ok(Self::Replayable(read.into_bytes())),
                Some(Err(_)) => return Err(UnreadableBody),
                Some(Ok(frame)) => frame,
            };
            let next = match frame.into_data() {
                Ok(data) if read.len() + data.len() as u64 <= MAX_REPLAY_BODY => {
                    read.push(data);
                    continue;
                }
                // The chunk that crosses the cap goes on as it came, uncopied.
                Ok(data) => Frame::data(data),
                // Trailers end the body, but a buffered body cannot carry them: it is sent
                // once, trailers and all.
                Err(trailers) => trailers,
            };
            let read = read.into_bytes();
            return Ok(Self::stream(body::Prefixed::new(read, Some(next), body)));
        }
    }

    fn stream<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (body, sent) = body::Notify::new(body);
        Self::Stream(body::boxed(body), sent, None)
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

/// The data of a body read for a replay, in one piece however many chunks or DATA frames it
/// came in: held as frames, a body of one-byte chunks would cost about a hundred bytes of
/// frame and an allocation per byte it carries. A body that came in one piece is kept as it
/// came, without a copy.
struct Buffer {
    /// The only chunk so far, while there has been one.
    one: Bytes,
    /// Every chunk, once there has been more than one.
    many: BytesMut,
    /// The body's length, when it is known: `many` never grows past it.
    known: Option<u64>,
}

impl Buffer {
    fn new(known: Option<u64>) -> Self {
        Self {
            one: Bytes::new(),
            many: BytesMut::new(),
            known,
        }
    }

    fn len(&self) -> u64 {
        (self.one.len() + self.many.len()) as u64
    }

    fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if self.many.is_empty() {
            if self.one.is_empty() {
                self.one = data;
                return;
            }
            // Room for twice what came so far, up to the stated length: memory follows the
            // bytes received, not the length a client states and may trickle towards.
            let first = std::mem::take(&mut self.one);
            let so_far = first.len() + data.len();
            let size = self.known.map_or(so_far, |n| (n as usize).min(2 * so_far));
            self.many.reserve(size.max(so_far));
            self.many.extend_from_slice(&first);
        }
        self.many.extend_from_slice(&data);
    }

    fn into_bytes(self) -> Bytes {
        if self.many.is_empty() {
            self.one
        } else {
            self.many.freeze()
        }
    }
}

/// An empty request body for mirrors and retries of body-less requests.
pub fn empty_body() -> ProxyBody {
    body::full(Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of unknown length that yields `frames` at once, one by one.
    fn chunked(
        frames: Vec<Frame<Bytes>>,
    ) -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Send + 'static {
        http_body_util::StreamBody::new(futures_util::stream::iter(
            frames.into_iter().map(Ok::<_, std::convert::Infallible>),
        ))
    }

    fn bytes_of(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    fn one_byte_chunks(body: &[u8]) -> Vec<Frame<Bytes>> {
        body.iter()
            .map(|b| Frame::data(Bytes::copy_from_slice(&[*b])))
            .collect()
    }

    /// The frames of a streamed payload, as the backend would be sent them.
    async fn frames_of(payload: Payload) -> Vec<Frame<Bytes>> {
        let (mut body, _) = payload.into_body();
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            frames.push(frame.expect("the test body cannot fail"));
        }
        frames
    }

    #[tokio::test]
    async fn a_finely_chunked_body_within_the_cap_is_replayable_byte_exact() {
        let body = bytes_of(MAX_REPLAY_BODY as usize);
        let payload = Payload::read(chunked(one_byte_chunks(&body)), true, true)
            .await
            .expect("readable");
        assert_eq!(payload.replayable().map(|b| b.as_ref()), Some(&body[..]));
    }

    #[tokio::test]
    async fn a_finely_chunked_body_past_the_cap_goes_on_with_what_was_read_in_one_frame() {
        let body = bytes_of(MAX_REPLAY_BODY as usize + 100);
        let payload = Payload::read(chunked(one_byte_chunks(&body)), true, true)
            .await
            .expect("readable");
        assert!(payload.replayable().is_none(), "past the cap: sent once");
        let frames = frames_of(payload).await;
        let first = frames[0].data_ref().expect("data");
        assert_eq!(
            first.len() as u64,
            MAX_REPLAY_BODY,
            "what was read goes on as one frame"
        );
        // The chunk that crossed the cap, then the rest as it came.
        assert_eq!(frames.len(), 1 + 100);
        let sent: Vec<u8> = frames
            .iter()
            .flat_map(|f| f.data_ref().expect("data").to_vec())
            .collect();
        assert_eq!(sent, body);
    }

    #[tokio::test]
    async fn trailers_send_the_body_once_with_them() {
        let mut frames = one_byte_chunks(b"hello");
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        frames.push(Frame::trailers(trailers.clone()));
        let payload = Payload::read(chunked(frames), true, true)
            .await
            .expect("readable");
        assert!(payload.replayable().is_none());
        let frames = frames_of(payload).await;
        assert_eq!(frames.len(), 2);
        assert_eq!(
            frames[0].data_ref().map(|d| d.as_ref()),
            Some(&b"hello"[..])
        );
        assert_eq!(frames[1].trailers_ref(), Some(&trailers));
    }

    /// A body of stated length within the cap is held even with no retry or mirror to replay
    /// it (so a client trickling it in holds no backend connection), unless told not to; one of
    /// unknown length is held only for a replay.
    #[tokio::test]
    async fn a_body_of_stated_length_is_held_unless_told_not_to() {
        let body = Bytes::from(bytes_of(1000));
        let full = || http_body_util::Full::new(body.clone());
        let held = Payload::read(full(), false, true).await.expect("readable");
        assert_eq!(held.replayable(), Some(&body));
        let streamed = Payload::read(full(), false, false).await.expect("readable");
        assert!(
            streamed.replayable().is_none(),
            "a gRPC call's body streams"
        );
        let unknown = chunked(vec![Frame::data(body.clone())]);
        let streamed = Payload::read(unknown, false, true).await.expect("readable");
        assert!(streamed.replayable().is_none(), "unknown length: streamed");
    }

    /// A stated length is not taken at its word: what is held follows the bytes that came, so
    /// a client stating 64 KiB and trickling a byte at a time holds little.
    #[test]
    fn a_stated_length_is_not_reserved_before_its_bytes_come() {
        let mut held = Buffer::new(Some(MAX_REPLAY_BODY));
        for byte in [b"a", b"b", b"c"] {
            held.push(Bytes::from_static(byte));
        }
        assert_eq!(held.len(), 3);
        assert!(held.many.capacity() < 1024, "{}", held.many.capacity());
    }

    #[tokio::test]
    async fn a_body_in_one_piece_is_kept_without_a_copy() {
        let body = Bytes::from(bytes_of(1000));
        let payload = Payload::read(http_body_util::Full::new(body.clone()), true, true)
            .await
            .expect("readable");
        let kept = payload.replayable().expect("within the cap");
        assert_eq!(kept, &body);
        assert_eq!(kept.as_ptr(), body.as_ptr(), "the same bytes, not a copy");
    }
}
