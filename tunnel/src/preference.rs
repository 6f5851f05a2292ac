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

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP/2 given up is tried again after 5 minutes, then after twice the wait each time it is
    /// given up again with no connection registered over it, up to an hour; a try in which one did
    /// register starts the waits over. A first wait longer than the hour is kept as it is.
    #[test]
    fn http2_given_up_is_tried_again_after_waits_doubling_up_to_an_hour() {
        let minutes = |d: Duration| d.as_secs_f64() / 60.0;
        let mut retry = Http2Retry::new(crate::options::DEFAULT_HTTP2_RETRY);
        let given_up = |retry: &mut Http2Retry, registered| {
            let wait = retry.given_up(registered, "dial failed".into());
            // Each give-up stands: a connection registered over QUIC after it.
            retry.registered(true, true);
            wait
        };
        let waits: Vec<f64> = (0..7)
            .map(|_| minutes(given_up(&mut retry, false)))
            .collect();
        assert_eq!(waits, [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]);
        assert_eq!(minutes(retry.wait()), 60.0, "the wait of the last give-up");
        for _ in 0..100 {
            given_up(&mut retry, false);
        }
        assert_eq!(minutes(retry.wait()), 60.0);
        // HTTP/2 registered in the last try: an outage since, not a path that never takes it.
        assert_eq!(minutes(given_up(&mut retry, true)), 5.0);
        assert_eq!(minutes(given_up(&mut retry, false)), 10.0);

        let mut short = Http2Retry::new(Duration::from_millis(300));
        let waits: Vec<u128> = (0..4)
            .map(|_| given_up(&mut short, false).as_millis())
            .collect();
        assert_eq!(waits, [300, 600, 1200, 2400]);
        let mut long = Http2Retry::new(Duration::from_secs(2 * 60 * 60));
        assert_eq!(minutes(given_up(&mut long, false)), 120.0);
        assert_eq!(minutes(given_up(&mut long, false)), 120.0);
    }

    /// A give-up of HTTP/2 stands once a connection registers over QUIC after it, and says what
    /// failed then. QUIC failing to reach the edge as well takes it back (an outage): the wait it
    /// doubled is undone, and after the outage the first registration, QUIC included, takes the
    /// next give-up back too. A registration over HTTP/2 takes any give-up back.
    #[test]
    fn a_give_up_of_http2_stands_only_where_quic_reaches_the_edge() {
        let minutes = |d: Duration| d.as_secs_f64() / 60.0;
        let mut retry = Http2Retry::new(crate::options::DEFAULT_HTTP2_RETRY);
        // Blocked TCP: QUIC registers after the give-up.
        assert_eq!(
            minutes(retry.given_up(true, "tcp connect timed out".into())),
            5.0
        );
        assert_eq!(
            retry.registered(true, true),
            Verdict::Stands {
                error: "tcp connect timed out".into(),
                retry_in: Duration::from_secs(5 * 60),
            }
        );
        assert_eq!(
            retry.registered(true, true),
            Verdict::Unchanged,
            "said once"
        );
        assert_eq!(retry.quic_unreachable(), Verdict::Unchanged, "stands");

        // An outage: QUIC fails as HTTP/2 did, in turn, and the waits do not grow.
        let mut retry = Http2Retry::new(crate::options::DEFAULT_HTTP2_RETRY);
        for _ in 0..3 {
            assert_eq!(minutes(retry.given_up(false, "refused".into())), 5.0);
            assert_eq!(
                retry.quic_unreachable(),
                Verdict::TakenBack { registered: false }
            );
            assert_eq!(
                retry.quic_unreachable(),
                Verdict::Unchanged,
                "taken back once"
            );
        }
        // The outage ends during a QUIC attempt: taken back, HTTP/2 is found out by moving.
        retry.given_up(false, "refused".into());
        assert_eq!(
            retry.registered(true, true),
            Verdict::TakenBack { registered: false }
        );
        // Past the outage, a give-up stands on the next QUIC registration again, after the first
        // wait.
        assert_eq!(minutes(retry.given_up(false, "refused".into())), 5.0);
        assert!(matches!(
            retry.registered(true, true),
            Verdict::Stands { .. }
        ));

        // HTTP/2 registering takes a give-up back, confirmed or not; registrations with the
        // preference standing change nothing.
        let mut retry = Http2Retry::new(crate::options::DEFAULT_HTTP2_RETRY);
        retry.given_up(true, "refused".into());
        assert_eq!(
            retry.registered(false, true),
            Verdict::TakenBack { registered: true }
        );
        assert_eq!(retry.registered(true, false), Verdict::Unchanged);
        retry.given_up(true, "refused".into());
        assert!(matches!(
            retry.registered(true, true),
            Verdict::Stands { .. }
        ));
        assert_eq!(
            retry.registered(false, true),
            Verdict::TakenBack { registered: true }
        );
    }
}
