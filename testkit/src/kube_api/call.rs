//! A request as a test's predicates see it, to pick the requests to hold, refuse or fail.

use serde_json::Value;

/// A request as an `ApiServer::hold`, `forbid` or `fail` predicate sees it.
pub struct Call<'a> {
    pub method: &'a str,
    /// The kind of the resource, or of the discovery document (`APIGroupList`, …).
    pub kind: &'static str,
    /// The name of the object the path names; `None` for a list, a create or discovery.
    pub name: Option<&'a str>,
    /// The request's body as JSON; `Null` when it has none (or it is not JSON).
    pub body: &'a Value,
}

/// A test's predicate over calls.
pub(super) type Matches = Box<dyn Fn(&Call<'_>) -> bool + Send + Sync>;
