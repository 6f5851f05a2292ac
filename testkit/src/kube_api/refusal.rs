//! Requests a test refuses or fails: refused ones get 403 Forbidden, the `Status` the API server
//! sends a client whose RBAC lacks the verb, until the test lifts the refusal (as if the
//! missing rule had been granted); failed ones get another code, as from an API server in
//! trouble (500 InternalError), until the test lifts the failure. Refusals are checked before
//! holds.

use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use tokio::sync::watch;

use super::call::{Call, Matches};
use super::response::{status, Reply};

/// The refusals in force, in the order they were made; the first that matches a request
/// answers it.
#[derive(Default)]
pub(super) struct Refusals {
    refusals: Mutex<Vec<Arc<Refusal>>>,
}

struct Refusal {
    matches: Matches,
    /// The status answered: `None` for 403 Forbidden, as the authorizer words it.
    code: Option<StatusCode>,
    /// Requests refused so far.
    refused: watch::Sender<usize>,
}

/// How a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// 403, as the authorizer words it for that request.
    Forbidden,
    /// A `Status` of this code ([`failure`]).
    Failed(StatusCode),
}

impl Refusals {
    /// Refuses every request `matches` picks (with `code`, or 403 for `None`) until the
    /// returned [`Forbid`] is lifted or dropped.
    pub(super) fn refuse(self: &Arc<Self>, code: Option<StatusCode>, matches: Matches) -> Forbid {
        let refusal = Arc::new(Refusal {
            matches,
            code,
            refused: watch::channel(0).0,
        });
        self.refusals
            .lock()
            .expect("the refusals' lock")
            .push(Arc::clone(&refusal));
        Forbid {
            refusal,
            refusals: Arc::clone(self),
        }
    }

    /// How `call` is refused, counting it; `None` when no refusal picks it.
    pub(super) fn refused(&self, call: &Call<'_>) -> Option<Refused> {
        let refusal = self
            .refusals
            .lock()
            .expect("the refusals' lock")
            .iter()
            .find(|r| (r.matches)(call))
            .cloned()?;
        refusal.refused.send_modify(|n| *n += 1);
        Some(refusal.code.map_or(Refused::Forbidden, Refused::Failed))
    }
}

/// The `Status` of a failed request, with the API server's reason for `code`.
pub(super) fn failure(code: StatusCode) -> Reply {
    let reason = match code.as_u16() {
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    status(code, reason, "the server cannot answer the request now")
}

/// Requests refused by `ApiServer::forbid` (or failed by `ApiServer::fail`). Lifting it, or
/// dropping it, serves them again.
pub struct Forbid {
    refusal: Arc<Refusal>,
    refusals: Arc<Refusals>,
}

impl Forbid {
    /// How many requests have been refused so far.
    pub fn count(&self) -> usize {
        *self.refusal.refused.borrow()
    }

    /// Waits until `n` requests have been refused.
    pub async fn refused(&self, n: usize) {
        let mut refused = self.refusal.refused.subscribe();
        let _ = refused.wait_for(|r| *r >= n).await;
    }

    /// Refuses no more: requests from now on are served.
    pub fn lift(&self) {
        self.refusals
            .refusals
            .lock()
            .expect("the refusals' lock")
            .retain(|r| !Arc::ptr_eq(r, &self.refusal));
    }
}

impl Drop for Forbid {
    fn drop(&mut self) {
        self.lift();
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use serde_json::Value;

    use super::*;

    fn call(kind: &'static str) -> Call<'static> {
        Call {
            method: "GET",
            kind,
            name: None,
            body: &Value::Null,
        }
    }

    fn of(kind: &'static str) -> Matches {
        Box::new(move |c: &Call<'_>| c.kind == kind)
    }

    #[tokio::test]
    async fn a_refusal_answers_what_it_picks_and_counts_it_until_lifted() {
        let refusals = Arc::new(Refusals::default());
        let forbid = refusals.refuse(None, of("Secret"));
        assert_eq!(refusals.refused(&call("Namespace")), None);
        assert_eq!(refusals.refused(&call("Secret")), Some(Refused::Forbidden));
        assert_eq!(refusals.refused(&call("Secret")), Some(Refused::Forbidden));
        forbid.refused(2).await;
        forbid.lift();
        assert_eq!(refusals.refused(&call("Secret")), None);
    }

    #[test]
    fn dropping_a_refusal_lifts_it_and_the_first_made_answers() {
        let refusals = Arc::new(Refusals::default());
        let failing = refusals.refuse(Some(StatusCode::SERVICE_UNAVAILABLE), of("Secret"));
        let forbid = refusals.refuse(None, of("Secret"));
        assert_eq!(
            refusals.refused(&call("Secret")),
            Some(Refused::Failed(StatusCode::SERVICE_UNAVAILABLE))
        );
        drop(failing);
        assert_eq!(refusals.refused(&call("Secret")), Some(Refused::Forbidden));
        drop(forbid);
        assert_eq!(refusals.refused(&call("Secret")), None);
    }

    #[tokio::test]
    async fn a_failure_carries_the_api_servers_reason_for_its_code() {
        let cases = [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (504, "Timeout"),
            (429, "Unknown"),
        ];
        for (code, reason) in cases {
            let code = StatusCode::from_u16(code).expect("a status code");
            let reply = failure(code);
            assert_eq!(reply.status(), code);
            let body = reply
                .into_body()
                .collect()
                .await
                .expect("a full body")
                .to_bytes();
            let status: Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(
                (status["code"].as_u64(), &status["reason"]),
                (Some(u64::from(code.as_u16())), &Value::from(reason))
            );
        }
    }
}
