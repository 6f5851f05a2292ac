//! When an `auto` tunnel's give-up of HTTP/2 stands, and when HTTP/2 is tried again after it:
//! the rule alone, kept apart from the connections it is applied to.

use std::time::Duration;

/// The longest wait before HTTP/2 is tried again after it was given up: a tunnel whose path
/// to the edge over HTTP/2 is mended gets gRPC's status back within the hour, however long it
/// was broken.
pub(crate) const HTTP2_RETRY_MAX: Duration = Duration::from_secs(60 * 60);

/// The shortest [`ConnectorOptions::http2_retry`](crate::ConnectorOptions::http2_retry): shorter, a connector where HTTP/2 does not
/// reach the edge would move its connections to it and back without pause.
pub(crate) const HTTP2_RETRY_MIN: Duration = Duration::from_secs(1);

/// Whether a give-up of HTTP/2 stands, and when HTTP/2 is tried again after it.
///
/// A give-up stands only where QUIC reaches the edge and HTTP/2 does not. Three failed HTTP/2
/// attempts cannot tell a path closed to HTTP/2 from an outage of the edge or the network (an
/// edge restarting, a blip of ten seconds), which fails them alike; QUIC tells them apart.
/// So a give-up is unconfirmed until a connection registers over QUIC after it; it is taken
/// back (and forgotten by the waits below) when the first QUIC attempt of a connection that
/// left HTTP/2 for it does not reach the edge either ([`quic_unreachable`](Self::quic_unreachable):
/// an outage, and the tunnel was on HTTP/2 before it), and when a connection registers over
/// HTTP/2 (it reaches the edge). After such an outage, with nothing registered since, the
/// first QUIC registration does not confirm the next give-up either but takes it back: the
/// outage may have ended between a connection's last HTTP/2 attempt and its QUIC one, and
/// whether HTTP/2 gets through now is found out by moving, one connection at a time, where
/// a give-up would leave gRPC without its status for the whole wait.
///
/// The waits: `first` after the first give-up ([`ConnectorOptions::http2_retry`](crate::ConnectorOptions::http2_retry)), then twice
/// as long after each try given up again with no connection registered over HTTP/2 since the
/// last one, up to [`HTTP2_RETRY_MAX`] (or `first`, if longer). A try in which a connection did
/// register (the edge took HTTP/2, and an outage took it away later) starts the waits over.
#[derive(Debug)]
pub(crate) struct Http2Retry {
    first: Duration,
    /// Give-ups in a row, the last one included, with no HTTP/2 registration between them.
    given_up: u32,
    /// The give-up in force, until a QUIC registration confirms it: what it changed, to be
    /// undone if it is taken back.
    unconfirmed: Option<Unconfirmed>,
    /// QUIC did not reach the edge after a give-up, and no connection has registered since.
    outage: bool,
}

/// A give-up not confirmed yet (see [`Http2Retry`]).
#[derive(Debug)]
struct Unconfirmed {
    /// [`Http2Retry::given_up`] before it.
    given_up: u32,
    /// Whether a connection had registered over HTTP/2 since the last try, before it.
    registered: bool,
    /// The last failure it was given up for, for the error logged once it stands.
    error: String,
}

/// What becomes of a give-up in force (see [`Http2Retry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing changes.
    Unchanged,
    /// It stands: QUIC reaches the edge where HTTP/2 did not (`error`, its last failure).
    /// HTTP/2 is tried again `retry_in` after the give-up.
    Stands { error: String, retry_in: Duration },
    /// It is taken back; `registered`: a connection had registered over HTTP/2 since the last
    /// try before it.
    TakenBack { registered: bool },
}

impl Http2Retry {
    pub(crate) fn new(first: Duration) -> Self {
        Self {
            first,
            given_up: 0,
            unconfirmed: None,
            outage: false,
        }
    }

    /// Takes in a give-up (`registered`: a connection registered over HTTP/2 since the last
    /// try; `error`: the last failure); the wait before the next try.
    pub(crate) fn given_up(&mut self, registered: bool, error: String) -> Duration {
        self.unconfirmed = Some(Unconfirmed {
            given_up: self.given_up,
            registered,
            error,
        });
        self.given_up = match registered {
            true => 1,
            false => self.given_up.saturating_add(1),
        };
        self.wait()
    }

    /// The first QUIC attempt of a connection that left HTTP/2 for the give-up in force did not
    /// reach the edge: taken back, unless it stands already.
    pub(crate) fn quic_unreachable(&mut self) -> Verdict {
        match self.unconfirmed.take() {
            Some(undo) => {
                self.outage = true;
                self.take_back(undo)
            }
            None => Verdict::Unchanged,
        }
    }

    /// A connection registered, over QUIC if `quic`, while HTTP/2 is given up if `given_up`.
    pub(crate) fn registered(&mut self, quic: bool, given_up: bool) -> Verdict {
        let after_outage = std::mem::take(&mut self.outage);
        if !given_up {
            return Verdict::Unchanged;
        }
        match (quic, self.unconfirmed.take()) {
            // Stood already.
            (true, None) => Verdict::Unchanged,
            (true, Some(undo)) if !after_outage => Verdict::Stands {
                error: undo.error,
                retry_in: self.wait(),
            },
            (_, Some(undo)) => self.take_back(undo),
            (false, None) => Verdict::TakenBack { registered: true },
        }
    }

    /// HTTP/2 is tried again: the give-up is over, whatever became of it.
    pub(crate) fn tried_again(&mut self) {
        self.unconfirmed = None;
        self.outage = false;
    }

    fn take_back(&mut self, undo: Unconfirmed) -> Verdict {
        self.given_up = undo.given_up;
        Verdict::TakenBack {
            registered: undo.registered,
        }
    }

    /// The wait before the next try, after the last give-up.
    pub(crate) fn wait(&self) -> Duration {
        let doublings = self.given_up.saturating_sub(1).min(20);
        self.first
            .saturating_mul(1 << doublings)
            .min(HTTP2_RETRY_MAX.max(self.first))
    }
}
