//! Gateway API filters, compiled: header modifiers, redirect, URL rewrite, mirror, CORS.
//!
//! Each filter edits `http::request::Parts` or a response `HeaderMap` in place; none of them
//! touches a runtime. Mirrors only carry their target here; sending is the forwarder's job.

mod cors;
mod headers;
mod path;
mod redirect;
mod rewrite;

pub use cors::{Allow, Cors, OriginPattern};
pub use headers::HeaderModifier;
pub use path::PathModifier;
pub use redirect::Redirect;
pub use rewrite::Rewrite;

use crate::forward::Upstream;
use std::sync::Arc;

/// A request-side edit, applied in document order.
#[derive(Debug)]
pub enum RequestEdit {
    Headers(HeaderModifier),
    Rewrite(Rewrite),
}

/// A mirror target: a copy of the request goes there, its answer is dropped.
#[derive(Debug)]
pub struct Mirror {
    pub upstream: Arc<Upstream>,
    /// The share of requests copied (see [`cftunnel_config::Fraction`]).
    pub share: cftunnel_config::Fraction,
}

/// The filters of one rule or one backend. Every rule and backend has one and most have none
/// set, so the rarely set redirect and CORS policy are boxed: the empty set is 64 bytes, not 300.
#[derive(Debug, Default)]
pub struct Filters {
    pub request: Box<[RequestEdit]>,
    pub response: Box<[HeaderModifier]>,
    pub redirect: Option<Box<Redirect>>,
    pub mirrors: Box<[Mirror]>,
    pub cors: Option<Box<Cors>>,
}

impl Filters {
    pub fn is_empty(&self) -> bool {
        self.request.is_empty()
            && self.response.is_empty()
            && self.redirect.is_none()
            && self.mirrors.is_empty()
            && self.cors.is_none()
    }

    /// Applies the request edits in order. `matched_prefix` feeds `ReplacePrefixMatch`.
    pub fn apply_request(&self, parts: &mut http::request::Parts, matched_prefix: Option<&str>) {
        for edit in self.request.iter() {
            match edit {
                RequestEdit::Headers(m) => m.apply(&mut parts.headers),
                RequestEdit::Rewrite(r) => r.apply(parts, matched_prefix),
            }
        }
    }

    pub fn apply_response(&self, headers: &mut http::HeaderMap) {
        for m in self.response.iter() {
            m.apply(headers);
        }
    }
}

#[cfg(test)]
mod tests;
