/// Why a config document was refused. The message names the field (`rules[3].matches[0].path`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("stale version {pushed}: version {current} is already applied")]
    Stale { pushed: i64, current: i64 },
    /// The document is not the config JSON; the message names the path (`rules[2].backends[0].weight`).
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.to_string(),
        }
    }
}
