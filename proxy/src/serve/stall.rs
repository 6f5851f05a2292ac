//! Which HTTP/2 response streams have had data waiting for the client's flow-control window
//! since long ago, counted without a clock, a lock or an allocation per frame.
//!
//! hyper's HTTP/2 server takes one chunk of a response body, then waits for the stream's window
//! before it asks for the next. A client that keeps the window shut (an initial window of 0, no
//! WINDOW_UPDATE) while it reads the socket and answers PINGs leaves it waiting for ever: the
//! socket never blocks, so the send timeout of blocked writes never fires, and the body, which
//! holds the backend connection and checks the rule's deadlines, is never polled again.
//!
//! Each such body is counted under the tick in which it last handed hyper data; the
//! connection's task ticks at least half a send timeout apart. A body still counted under the
//! tick two before the current one has been waiting through two whole ticks, a send timeout at
//! least. A server gets no handle on a hyper stream to reset it with, and the one part of the
//! stream that is the proxy's, the body, is what hyper stopped polling: so the whole connection
//! is dropped, as one whose writes stay blocked is.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Ticks whose counts are kept: the current one and the two before it.
const KEPT: usize = 3;

/// A connection's count of response bodies that handed hyper data, by tick.
#[derive(Debug, Default)]
pub(super) struct Stalls {
    tick: AtomicUsize,
    /// Bodies whose last poll handed data, under the tick (mod [`KEPT`]) they are counted in.
    waiting: [AtomicUsize; KEPT],
}

/// Where one body is counted: the tick of its last poll that handed data, while it is the
/// last poll. A body that keeps handing data within one tick changes no shared count.
#[derive(Debug, Default)]
pub(super) struct Mark(Option<usize>);

impl Stalls {
    /// A poll of the body handed hyper data: it waits for the window from now on.
    pub(super) fn handed(&self, mark: &mut Mark) {
        let now = self.tick.load(Ordering::Relaxed);
        if mark.0 != Some(now) {
            self.polled(mark);
            self.slot(now).fetch_add(1, Ordering::Relaxed);
            mark.0 = Some(now);
        }
    }

    /// A poll of the body handed no data (it waits for its backend, or ended), or the body is
    /// dropped: it no longer waits for the window.
    pub(super) fn polled(&self, mark: &mut Mark) {
        if let Some(tick) = mark.0.take() {
            self.slot(tick).fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Ends the current tick; true when a body has been waiting since the tick two before it.
    pub(super) fn tick(&self) -> bool {
        let now = self.tick.load(Ordering::Relaxed);
        // The count of two ticks before is read before the tick moves on, and becomes the new
        // tick's: a body that reads the old tick counts itself under it, one that reads the
        // new one is counted after this look.
        let next = now.wrapping_add(1);
        let stalled = self.slot(next).load(Ordering::Relaxed) > 0;
        self.tick.store(next, Ordering::Relaxed);
        stalled
    }

    fn slot(&self, tick: usize) -> &AtomicUsize {
        &self.waiting[tick % KEPT]
    }
}

#[cfg(test)]
mod tests {
    use super::{Mark, Stalls};

    #[test]
    fn a_body_waiting_through_two_whole_ticks_is_stalled() {
        let stalls = Stalls::default();
        let mut mark = Mark::default();
        stalls.handed(&mut mark);
        assert!(!stalls.tick(), "it waited part of a tick at most");
        assert!(!stalls.tick(), "one whole tick");
        assert!(stalls.tick(), "two whole ticks");
    }

    #[test]
    fn a_body_that_hands_data_every_tick_is_not_stalled() {
        let stalls = Stalls::default();
        let mut mark = Mark::default();
        for _ in 0..10 {
            stalls.handed(&mut mark);
            stalls.handed(&mut mark);
            assert!(!stalls.tick());
        }
        // Every other tick is enough too: never a whole two.
        for _ in 0..10 {
            stalls.handed(&mut mark);
            assert!(!stalls.tick());
            assert!(!stalls.tick());
        }
    }

    #[test]
    fn a_body_that_waits_for_its_backend_is_not_stalled() {
        let stalls = Stalls::default();
        let mut mark = Mark::default();
        stalls.handed(&mut mark);
        stalls.polled(&mut mark);
        for _ in 0..10 {
            assert!(!stalls.tick());
        }
        // Nor one that was dropped while waiting for the window.
        let mut dropped = Mark::default();
        stalls.handed(&mut dropped);
        stalls.polled(&mut dropped);
        stalls.polled(&mut dropped);
        for _ in 0..10 {
            assert!(!stalls.tick());
        }
    }

    #[test]
    fn one_stalled_body_among_moving_ones_is_found() {
        let stalls = Stalls::default();
        let (mut stuck, mut moving) = (Mark::default(), Mark::default());
        stalls.handed(&mut stuck);
        stalls.handed(&mut moving);
        assert!(!stalls.tick());
        stalls.handed(&mut moving);
        assert!(!stalls.tick());
        stalls.handed(&mut moving);
        assert!(stalls.tick());
        stalls.polled(&mut stuck);
        stalls.handed(&mut moving);
        assert!(!stalls.tick());
        assert!(!stalls.tick());
    }
}
