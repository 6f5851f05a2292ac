//! The errors of one try against a backend. Their kinds are what the backend-error metrics
//! count (`label`), what decides whether a try is retried, and what the error responses are
//! built from.

use super::connector::ConnectError;
use crate::body::BoxError;

/// Errors of one try against a backend; `label()` is the metrics reason.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot connect to backend: {0}")]
    Dial(#[source] ConnectError),
    #[error("TLS handshake with backend failed: {0}")]
    Tls(#[source] ConnectError),
    #[error("backend did not answer in time")]
    Timeout,
    /// The pooled connection closed before the request could be sent on it.
    #[error("backend connection closed before the request was sent")]
    Canceled,
    /// The backend had its most connections open, and none came free within the try's
    /// timeout: the request never reached it.
    #[error("no backend connection came free in time (connection limit reached)")]
    Saturated,
    /// The backend answered with a response the proxy cannot read as HTTP: a malformed or
    /// oversized head, conflicting lengths, a transfer coding other than `chunked`, or (over
    /// HTTP/2) a head the protocol forbids. It has seen the request, and may have acted on it.
    #[error("backend sent an invalid response: {0}")]
    InvalidResponse(#[source] BoxError),
    #[error("backend exchange failed: {0}")]
    Other(#[source] BoxError),
}

impl ForwardError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Dial(_) => "dial",
            Self::Tls(_) => "tls",
            // Out of time waiting for a connection: the contract's reasons have no closer one.
            Self::Timeout | Self::Saturated => "timeout",
            Self::Canceled => "canceled",
            // The contract has no reason of its own for a backend that broke the protocol.
            Self::InvalidResponse(_) | Self::Other(_) => "other",
        }
    }

    /// Failures a retry may cure: the backend was unreachable, busy, dropped the exchange, or
    /// did not answer within the per-try timeout. TLS failures are configuration and are not
    /// retried; nor is an invalid response, to a request the backend may already have
    /// processed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Dial(_) | Self::Timeout | Self::Saturated | Self::Canceled | Self::Other(_)
        )
    }

    /// The same failure for another request that waited on the same dial (an `Other` source
    /// becomes its text).
    pub(super) fn duplicate(&self) -> Self {
        match self {
            Self::Dial(e) => Self::Dial(e.clone()),
            Self::Tls(e) => Self::Tls(e.clone()),
            Self::Timeout => Self::Timeout,
            Self::Saturated => Self::Saturated,
            Self::Canceled => Self::Canceled,
            Self::InvalidResponse(e) => Self::InvalidResponse(e.to_string().into()),
            Self::Other(e) => Self::Other(e.to_string().into()),
        }
    }

    pub(super) fn from_hyper(err: hyper::Error) -> Self {
        if err.is_canceled() {
            Self::Canceled
        } else if err.is_parse() || malformed_over_http2(&err) {
            // `is_parse` covers an HTTP/1.1 head that is too large as well
            // (`is_parse_too_large`).
            Self::InvalidResponse(err.into())
        } else {
            Self::Other(err.into())
        }
    }
}

/// Whether h2 itself reset the stream for a protocol error: the HTTP/2 backend's response head
/// was malformed (conflicting `content-length`s, a connection-specific header, a header block
/// over the size allowed) or came on a stream it never opened properly (RFC 9113 §8.1.1).
fn malformed_over_http2(err: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<::h2::Error>() {
            return h2.is_library()
                && h2.is_reset()
                && h2.reason() == Some(::h2::Reason::PROTOCOL_ERROR);
        }
        source = cause.source();
    }
    false
}
