//! Requests a test holds: the server reads them and does not answer, as an API server that is
//! overloaded or cut off from its client, until the test releases them; they are then served
//! as if they had just come, against the objects as they are by then.

use std::sync::{Arc, Mutex};

use hyper::Response;
use tokio::sync::watch;

use super::call::{Call, Matches};

/// The holds in force, in the order they were made; the first that matches a request holds it.
#[derive(Default)]
pub(super) struct Holds {
    gates: Mutex<Vec<Arc<Gate>>>,
}

struct Gate {
    matches: Matches,
    open: watch::Sender<bool>,
    /// Requests held so far.
    arrived: watch::Sender<usize>,
    /// The statuses held requests were answered with, in the order they were answered. A
    /// request whose client gave up before the release may never be.
    answered: watch::Sender<Vec<u16>>,
}

impl Holds {
    /// Holds every request `matches` picks until the returned [`Hold`] is released or dropped.
    pub(super) fn hold(self: &Arc<Self>, matches: Matches) -> Hold {
        let gate = Arc::new(Gate {
            matches,
            open: watch::channel(false).0,
            arrived: watch::channel(0).0,
            answered: watch::channel(Vec::new()).0,
        });
        self.gates
            .lock()
            .expect("the holds' lock")
            .push(Arc::clone(&gate));
        Hold {
            gate,
            holds: Arc::clone(self),
        }
    }

    /// `serve`'s answer to `call`: at once, or once released if a hold picks it.
    pub(super) async fn admit<B>(
        &self,
        call: &Call<'_>,
        serve: impl FnOnce() -> Response<B>,
    ) -> Response<B> {
        let gate = self
            .gates
            .lock()
            .expect("the holds' lock")
            .iter()
            .find(|g| (g.matches)(call))
            .cloned();
        let Some(gate) = gate else {
            return serve();
        };
        gate.arrived.send_modify(|n| *n += 1);
        let _ = gate.open.subscribe().wait_for(|open| *open).await;
        let res = serve();
        gate.answered.send_modify(|a| a.push(res.status().as_u16()));
        res
    }
}

/// Requests held by `ApiServer::hold`. Releasing it, or dropping it, serves them.
pub struct Hold {
    gate: Arc<Gate>,
    holds: Arc<Holds>,
}

impl Hold {
    /// Waits until `n` requests have been held.
    pub async fn arrived(&self, n: usize) {
        let mut arrived = self.gate.arrived.subscribe();
        let _ = arrived.wait_for(|a| *a >= n).await;
    }

    /// Serves the requests held so far, and holds no more.
    pub fn release(&self) {
        self.holds
            .gates
            .lock()
            .expect("the holds' lock")
            .retain(|g| !Arc::ptr_eq(g, &self.gate));
        self.gate.open.send_replace(true);
    }

    /// Waits until `n` held requests have been answered; their statuses, in answer order.
    pub async fn answered(&self, n: usize) -> Vec<u16> {
        let mut answered = self.gate.answered.subscribe();
        let statuses = answered
            .wait_for(|a| a.len() >= n)
            .await
            .map(|a| a.clone())
            .unwrap_or_default();
        statuses
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hyper::StatusCode;
    use serde_json::Value;

    use super::*;

    fn call(method: &str) -> Call<'_> {
        Call {
            method,
            kind: "Secret",
            name: None,
            body: &Value::Null,
        }
    }

    fn answer(code: StatusCode) -> Response<()> {
        let mut res = Response::new(());
        *res.status_mut() = code;
        res
    }

    fn holds_gets(holds: &Arc<Holds>) -> Hold {
        holds.hold(Box::new(|c: &Call<'_>| c.method == "GET"))
    }

    #[tokio::test]
    async fn a_request_no_hold_picks_is_served_at_once() {
        let holds = Arc::new(Holds::default());
        let _hold = holds_gets(&holds);
        let res = holds.admit(&call("PATCH"), || answer(StatusCode::OK)).await;
        assert_eq!(res.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_held_request_is_served_once_released_and_its_answer_recorded() {
        let holds = Arc::new(Holds::default());
        let hold = holds_gets(&holds);
        let admitting = Arc::clone(&holds);
        let mut held = tokio::spawn(async move {
            admitting
                .admit(&call("GET"), || answer(StatusCode::CONFLICT))
                .await
                .status()
        });
        hold.arrived(1).await;
        let unanswered = tokio::time::timeout(Duration::from_millis(50), &mut held).await;
        assert!(unanswered.is_err(), "answered while held");
        hold.release();
        assert_eq!(held.await.expect("served"), StatusCode::CONFLICT);
        assert_eq!(hold.answered(1).await, [409]);
        // Released: later requests are not held.
        let later = holds.admit(&call("GET"), || answer(StatusCode::OK)).await;
        assert_eq!(later.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn dropping_a_hold_releases_it() {
        let holds = Arc::new(Holds::default());
        let hold = holds_gets(&holds);
        let admitting = Arc::clone(&holds);
        let held = tokio::spawn(async move {
            admitting
                .admit(&call("GET"), || answer(StatusCode::OK))
                .await
                .status()
        });
        hold.arrived(1).await;
        drop(hold);
        assert_eq!(held.await.expect("served"), StatusCode::OK);
    }

    #[tokio::test]
    async fn the_first_hold_made_that_picks_a_request_holds_it() {
        let holds = Arc::new(Holds::default());
        let first = holds_gets(&holds);
        let second = holds.hold(Box::new(|_: &Call<'_>| true));
        let admitting = Arc::clone(&holds);
        let held = tokio::spawn(async move {
            admitting
                .admit(&call("GET"), || answer(StatusCode::OK))
                .await
                .status()
        });
        first.arrived(1).await;
        second.release();
        first.release();
        assert_eq!(held.await.expect("served"), StatusCode::OK);
        assert_eq!(first.answered(1).await, [200]);
        assert!(second.answered(0).await.is_empty());
    }
}
