//! Gateway API controller: translation of Gateway API objects into proxy config.
