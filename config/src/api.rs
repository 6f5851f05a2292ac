//! What the proxy's config API says of a pod, read by the controller: `GET /config`.

use serde::{Deserialize, Serialize};

/// The [`ConfigState::enforces`] entry of a proxy that checks rules' `access` requirements.
pub const ENFORCES_ACCESS: &str = "access";

/// The answer to `GET /config`: the version served, readiness, and the checks a rule may ask
/// for that this proxy enforces.
///
/// `enforces` exists because a document's unknown fields are ignored (as the Go
/// implementation ignores them): a proxy of a release before a check, or the Go proxy, would
/// take a rule asking for it and serve the rule unchecked. It lets a pusher tell such a pod
/// apart, once the releases it may meet all list what they enforce (those that added Access
/// before this list did not).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigState {
    pub version: i64,
    #[serde(default)]
    pub ready: bool,
    #[serde(default, deserialize_with = "super::document::null_as_empty")]
    pub enforces: Vec<String>,
}

impl ConfigState {
    /// Whether the pod checks rules' `access` requirements.
    pub fn enforces_access(&self) -> bool {
        self.enforces.iter().any(|e| e == ENFORCES_ACCESS)
    }
}
