use cftunnel_config::valid::RuleRefused;

/// Why a config document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A rule breaks the contract; the message names the field from the document's root
    /// (`rules[3].matches[0].path: ...`), and the error carries the rule's position and name.
    #[error(transparent)]
    Refused(RuleRefused),
    #[error("stale version {pushed}: version {current} is already applied")]
    Stale { pushed: i64, current: i64 },
    /// Versions grow from 1; 0 is a document without one.
    #[error("version: {0} is below 0 (0 is unversioned; versions start at 1)")]
    NegativeVersion(i64),
    /// The document is not the config JSON; the message names the path (`rules[2].backends[0].weight`).
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
}
